"""The PostgreSQL image gets only the modules its entrypoint imports (images/postgres/
Dockerfile.dockerignore), so operator-only changes rebuild no PostgreSQL image. This keeps that list
honest: every pg_operator module the instance code imports, at any depth and inside functions too, must
be in the image's context."""

from __future__ import annotations

import ast
from pathlib import Path

from localkube.images.spec import context_files, find_specs

SRC = Path(__file__).resolve().parents[3] / "src"


def module_file(name: str) -> Path | None:
    path = SRC.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imported_closure(roots: list[str]) -> set[Path]:
    """Files of every pg_operator module reachable by import statements anywhere in the roots' code."""
    files: set[Path] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        file = module_file(name)
        if file is None or file in files:
            continue
        files.add(file)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run too
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pg_operator"):
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("pg_operator")]
    return files


def test_every_module_the_instance_imports_is_in_the_postgres_image() -> None:
    instance_dir = SRC / "pg_operator" / "instance"
    instance = sorted(f"pg_operator.instance.{p.stem}" for p in instance_dir.glob("*.py"))
    needed = imported_closure(instance)
    assert SRC / "pg_operator" / "instance" / "patroni_config.py" in needed  # the walk found the code
    spec = next(s for s in find_specs() if s.name.endswith("/postgres"))
    shipped = {f.resolve() for f in context_files(spec)}
    missing = sorted(str(f.relative_to(SRC)) for f in needed if f.resolve() not in shipped)
    assert missing == [], f"add to images/postgres/Dockerfile.dockerignore: {missing}"


def test_the_operator_s_own_code_is_not_in_the_postgres_image() -> None:
    spec = next(s for s in find_specs() if s.name.endswith("/postgres"))
    shipped = {str(f.relative_to(SRC)) for f in context_files(spec) if SRC in f.parents}
    assert not any(f.startswith(("pg_operator/controller/", "pg_operator/specs/")) for f in shipped)
