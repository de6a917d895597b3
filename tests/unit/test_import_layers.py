"""The packages' layering, from their import statements (at any depth, inside functions too).

Every module of pg_operator belongs to one group of `LAYERS` (the longest prefix listed); a group may
import only itself and the groups it lists. A module no group covers fails the test, so a new package or
controller module has to be placed in a layer. From the bottom (docs/architecture.md#layers):

- leaves (`objects`, `images`, `scram`, `tls_files`, `tls_server`, `privileged_sql`, `api.constants`,
  `pooler_contract`) import nothing of pg_operator;
- `api/` the leaves; `backup/`, `orchestration/`, `patroni/` api and the leaves; `specs/` (the operator's
  builders) those and `backup/`, `orchestration/`, but never code that runs inside pods;
- in-pod code (`instance/`, `pooler/`, `backup.instance_hook`) what its image ships: never `specs` or
  `controller`;
- inside `controller/`: the plumbing (cache, informers, API client, writes, Events, the work loop …) →
  the sub-reconcilers (`reconcilers/`) and the backup reconcilers (`backup_reconcilers/`), which never
  import each other → the cluster reconciler (`reconcile`) → the wiring (`wakeups`, `operator`);
- `cli/` on top; nothing imports it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
P = "pg_operator"
LEAVES = {
    f"{P}.objects",
    f"{P}.images",
    f"{P}.scram",
    f"{P}.tls_files",
    f"{P}.tls_server",
    f"{P}.privileged_sql",
    f"{P}.pooler_contract",
    f"{P}.api.constants",
}
API = {f"{P}.api", *LEAVES}
BUILDING_BLOCKS = {
    f"{P}.backup",
    f"{P}.orchestration",
    f"{P}.orchestration.patroni_settings",
    f"{P}.patroni",
    *API,
}
# Modules that run inside the PostgreSQL or pooler pods: the operator's code never imports them.
IN_POD = {f"{P}.instance", f"{P}.pooler", f"{P}.backup.instance_hook"}
CONTROLLER = f"{P}.controller"
PLUMBING = {
    f"{CONTROLLER}.{m}"
    for m in (
        "backoff",
        "cache",
        "cache_admission",
        "cache_sync",
        "diff",
        "events",
        "failure_report",
        "health",
        "heap_trim",
        "informer",
        "instance_metrics",
        "keys",
        "kube_api",
        "lease",
        "loop",  # the generic work loop both kinds of reconciler run on; it imports no reconciler
        "cluster_memory",
        "metrics",
        "nodes",  # the Nodes' readiness, from their informer (node loss; drains)
        "pod_exec",
        "secret_reads",
        "store_limits",
        "store_calls",  # bounded calls to tenants' stores, for both kinds of reconciler
        "store_client",
        "backup_kinds",
        "workqueue",
        "writes",
    )
}
OPERATOR_BELOW_RECONCILERS = {*BUILDING_BLOCKS, f"{P}.specs", CONTROLLER, *PLUMBING}

# Group → the groups (besides itself) its modules may import.
LAYERS: dict[str, set[str]] = {
    P: set(),  # the root package's docstring
    **{leaf: set() for leaf in LEAVES},
    f"{P}.api": set(LEAVES),
    f"{P}.backup": set(API),
    f"{P}.backup.instance_hook": {f"{P}.backup", *API},
    f"{P}.orchestration": set(API),
    f"{P}.patroni": set(API),
    f"{P}.specs": set(BUILDING_BLOCKS),
    f"{P}.instance": {
        f"{P}.backup",
        f"{P}.backup.instance_hook",
        f"{P}.orchestration.patroni_settings",
        *API,
    },
    f"{P}.orchestration.patroni_settings": set(API),
    # The pooler's supervisor: the standard library and its leaves (a pooler pod asks for 64Mi).
    f"{P}.pooler": {f"{P}.tls_server", f"{P}.pooler_contract"},
    CONTROLLER: set(),  # the package's docstring
    **{m: {*BUILDING_BLOCKS, f"{P}.specs", CONTROLLER, *PLUMBING} for m in PLUMBING},
    f"{CONTROLLER}.reconcilers": set(OPERATOR_BELOW_RECONCILERS),
    # Drains and placement: the sub-reconcilers' base (the package) and the plumbing; the switchover it
    # calls for is the high-availability sub-reconciler's, decided by orchestration.drains.
    f"{CONTROLLER}.reconcilers.drains": {f"{CONTROLLER}.reconcilers", *OPERATOR_BELOW_RECONCILERS},
    f"{CONTROLLER}.backup_reconcilers": set(OPERATOR_BELOW_RECONCILERS),
    f"{CONTROLLER}.reconcile": {
        f"{CONTROLLER}.reconcilers",
        f"{CONTROLLER}.reconcilers.drains",
        *OPERATOR_BELOW_RECONCILERS,
    },
    f"{CONTROLLER}.wakeups": {f"{CONTROLLER}.backup_reconcilers", *OPERATOR_BELOW_RECONCILERS},
    f"{CONTROLLER}.operator": {
        f"{CONTROLLER}.reconcile",
        f"{CONTROLLER}.wakeups",
        f"{CONTROLLER}.reconcilers",
        f"{CONTROLLER}.reconcilers.drains",
        f"{CONTROLLER}.backup_reconcilers",
        *OPERATOR_BELOW_RECONCILERS,
    },
    f"{P}.cli": {
        f"{CONTROLLER}.operator",
        f"{CONTROLLER}.lease",
        *OPERATOR_BELOW_RECONCILERS,
    },
}
# Known edges against the layers (module, group it imports), each to be removed by the change named
# beside it. None today; the test below fails on an entry no import needs.
TEMPORARY: set[tuple[str, str]] = set()


@cache
def modules() -> dict[str, Path]:
    out = {}
    for file in sorted((SRC / P).rglob("*.py")):
        parts = file.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def imports(file: Path) -> set[str]:
    """The pg_operator modules a file imports (for `from a import b`: a.b when that is a module, else a)."""
    found: set[str] = set()
    known = modules()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(P):
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            # `from package import module` imports the module (the package's __init__ runs for any
            # import of its modules); `from module import name` imports the module.
            found.update(submodules if submodules and len(submodules) == len(node.names) else {node.module})
            found.update(submodules)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(P))
    # The root package runs before any of its modules, whoever imports them: not an edge (it imports
    # nothing, a leaf like the others).
    return {name for name in found if name in known and name != P}


def group(module: str) -> str | None:
    """The longest prefix of `module` that LAYERS lists (None: the module is in no layer)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return prefix
    return None


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(edges: dict[str, set[str]]) -> list[str]:
    """`module imports target` for each edge its groups' layers do not allow."""
    wrong = []
    for mod, targets in sorted(edges.items()):
        own = group(mod)
        assert own is not None
        for target in sorted(targets):
            theirs = group(target)
            if theirs == own or theirs in LAYERS[own]:
                continue
            if (mod, theirs) in TEMPORARY:
                continue
            wrong.append(f"{mod} imports {target} ({own} may not import {theirs})")
    return wrong


def edges() -> dict[str, set[str]]:
    return {mod: imports(file) for mod, file in modules().items()}


def test_the_walk_sees_the_imports() -> None:
    found = imports(modules()["pg_operator.api.cluster"])
    assert {"pg_operator.api.backup", "pg_operator.api.schema"} <= found


def test_every_module_is_in_a_layer() -> None:
    assert sorted(m for m in modules() if group(m) is None) == []


def test_every_layer_names_modules_that_exist() -> None:
    known = modules()
    named = set(LAYERS) | {g for allowed in LAYERS.values() for g in allowed}
    assert sorted(g for g in named if not any(m == g or m.startswith(g + ".") for m in known)) == []


def test_every_import_keeps_the_layers() -> None:
    assert violations(edges()) == []


def test_a_builder_importing_in_pod_code_is_refused() -> None:
    """The check itself: the edges the layers were written to stop are caught."""
    for bad in (
        ("pg_operator.specs.statefulset", "pg_operator.instance.metrics"),
        ("pg_operator.specs.pooler", "pg_operator.pooler.config"),
        ("pg_operator.specs.backup_pod", "pg_operator.backup.instance_hook"),
        ("pg_operator.controller.reconcilers.instances", "pg_operator.controller.backup_reconcilers.store"),
        ("pg_operator.controller.reconcilers.tls", "pg_operator.controller.reconcile"),
        ("pg_operator.controller.cache", "pg_operator.controller.reconcilers"),
        ("pg_operator.api.cluster", "pg_operator.specs.names"),
    ):
        assert violations({bad[0]: {bad[1]}}) != [], bad


def test_temporary_edges_are_still_needed() -> None:
    """An allowance no import uses any more must go (the change that removes the edge deletes it)."""
    used = {(m, group(t)) for m, targets in edges().items() for t in targets}
    assert sorted(TEMPORARY - used) == []


def test_the_operator_never_imports_in_pod_code() -> None:
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in edges().items()
        if group(m) not in IN_POD
        for t in targets
        if group(t) in IN_POD
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


@pytest.mark.parametrize("pkg", sorted({package(m) for m in modules()} - {""}))
def test_no_cycle_between_modules_of(pkg: str) -> None:
    mods = {m: f for m, f in modules().items() if package(m) == pkg}
    # A package's __init__ is run by every import of its modules; it is not an edge of its own.
    inits = {m for m, f in mods.items() if f.name == "__init__.py"}
    graph = {m: {t for t in imports(f) if t in mods and t not in inits} for m, f in mods.items()}
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
