"""The supervisor's own decisions: when the watchdog resumes, what a pause leaves behind."""

from __future__ import annotations

from pathlib import Path

from pg_operator.pooler.config import settings_from_env
from pg_operator.pooler.main import current_target, deadline_passed, is_paused, main


def test_the_watchdog_resumes_at_the_deadline_and_on_garbage() -> None:
    assert deadline_passed(None, 100.0) is False
    assert deadline_passed("150.5\n", 100.0) is False
    assert deadline_passed("150.5\n", 150.5) is True
    assert deadline_passed("not a time", 100.0) is True


def test_paused_and_target_come_from_the_run_directory(tmp_path: Path) -> None:
    s = settings_from_env({"POOLER_CLUSTER": "db", "POOLER_TARGET_HOST": "db-rw.shop.svc",
                           "POOLER_RUN_DIR": str(tmp_path)})  # fmt: skip
    assert current_target(s) == "db-rw.shop.svc"
    assert is_paused(s) is False
    (tmp_path / "target").write_text("db-1.db.shop.svc\n")
    (tmp_path / "pause-deadline").write_text("1\n")
    assert current_target(s) == "db-1.db.shop.svc"
    assert is_paused(s) is True


def test_unknown_commands_and_missing_environment_exit_non_zero(monkeypatch: object) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["show"]) == 1  # no POOLER_CLUSTER in the test's environment


def test_the_pod_side_imports_no_pydantic() -> None:
    import ast
    from pathlib import Path

    from pg_operator.pooler import config

    package = Path(config.__file__).parent
    # The pod's modules, the contract with its Deployment and the bounded HTTPS server they share with the
    # instances (leaves).
    for module in [
        *package.glob("*.py"),
        package.parent / "pooler_contract.py",
        package.parent / "tls_server.py",
    ]:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                allowed = (
                    "pg_operator.pooler",
                    "pg_operator.tls_server",
                    "__future__",
                    "collections",
                    "concurrent",
                    "dataclasses",
                    "http",
                    "typing",
                )
                assert node.module.startswith(allowed), f"{module.name} imports {node.module}"
