"""The packages' layering, from their import statements (at any depth, inside functions too): the leaves
import nothing of pg_operator, `api/` only the leaves, `backup/` only `api/` and the leaves, and no
package depends on itself through another."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
LEAVES = (
    "pg_operator",
    "pg_operator.objects",
    "pg_operator.images",
    "pg_operator.scram",
    "pg_operator.api.constants",
    "pg_operator.privileged_sql",
)
# Package → the packages (besides itself) its modules may import.
ALLOWED: dict[str, set[str]] = {
    "api": {"objects", "images"},
    "backup": {"api", "objects", "images"},
}


@cache
def modules() -> dict[str, Path]:
    out = {}
    for file in sorted((SRC / "pg_operator").rglob("*.py")):
        parts = file.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def imports(file: Path) -> set[str]:
    """The pg_operator modules a file imports (for `from a import b`: a, and a.b when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pg_operator"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pg_operator"))
    known = modules()
    # The root package runs before any of its modules, whoever imports them: not an edge (it imports
    # nothing, a leaf like the others).
    return {name for name in found if name in known and name != "pg_operator"}


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_walk_sees_the_imports() -> None:
    found = imports(modules()["pg_operator.api.cluster"])
    assert {"pg_operator.api.backup", "pg_operator.api.schema"} <= found


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_nothing_of_pg_operator(leaf: str) -> None:
    assert imports(modules()[leaf]) == set()


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_lower_packages_import_no_higher_one(pkg: str) -> None:
    wrong = sorted(
        f"{mod} imports {target}"
        for mod, file in modules().items()
        if package(mod) == pkg
        for target in imports(file)
        if package(target) not in {pkg, *ALLOWED[pkg]}
    )
    assert wrong == []


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for mod, file in modules().items():
        graph.setdefault(package(mod), set()).update(
            package(t) for t in imports(file) if package(t) != package(mod)
        )
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, "import cycle: " + " -> ".join((*path, node))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, (*path, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_no_cycle_between_modules_of(pkg: str) -> None:
    mods = {m: f for m, f in modules().items() if package(m) == pkg}
    # A package's __init__ is run by every import of its modules; it is not an edge of its own.
    graph = {m: {t for t in imports(f) if t in mods and t != f"pg_operator.{pkg}"} for m, f in mods.items()}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, "import cycle: " + " -> ".join((*path, node))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, (*path, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())
