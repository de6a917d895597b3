"""`kubectl pgc psql`/`reload`: which instance, and the exec command line (no password anywhere)."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest

from pg_operator.cli.pgc.connection import Connection
from pg_operator.cli.pgc.errors import NOT_FOUND, NOT_READY, PgcError
from pg_operator.cli.pgc.sql import pick_instance, psql_argv


def pod(name: str, role: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"role": role}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


PODS = [pod("db-0", "replica"), pod("db-1", "primary"), pod("db-2", "replica"), pod("db-3", "replica", False)]
STATUS = {
    "currentPrimary": "db-1",
    "instances": [
        {"name": "db-0", "role": "replica", "lagBytes": 5 << 20},
        {"name": "db-1", "role": "primary"},
        {"name": "db-2", "role": "replica", "lagBytes": 0},
        {"name": "db-3", "role": "replica", "lagBytes": 0},
    ],
}


def test_the_primary_by_default() -> None:
    assert pick_instance(STATUS, PODS, replica=False, instance=None) == "db-1"


def test_the_ready_replica_with_the_least_lag() -> None:
    assert pick_instance(STATUS, PODS, replica=True, instance=None) == "db-2"  # db-3 is not ready


def test_a_named_instance_whatever_its_role_and_an_unknown_one_refused() -> None:
    assert pick_instance(STATUS, PODS, replica=False, instance="db-3") == "db-3"
    with pytest.raises(PgcError) as err:
        pick_instance(STATUS, PODS, replica=False, instance="db-9")
    assert err.value.code == NOT_FOUND


def test_no_primary_or_no_ready_replica_is_not_ready() -> None:
    with pytest.raises(PgcError) as err:
        pick_instance({"instances": []}, [pod("db-0", "replica")], replica=False, instance=None)
    assert err.value.code == NOT_READY
    with pytest.raises(PgcError) as err:
        pick_instance(STATUS, [pod("db-1", "primary")], replica=True, instance=None)
    assert err.value.code == NOT_READY


def test_exec_line_carries_the_connection_choices_and_no_password() -> None:
    conn = Connection(client=None, namespace="shop", kubeconfig="/k/admin.conf", context="ctx")  # type: ignore[arg-type]
    with patch("shutil.which", return_value="/usr/bin/kubectl"):
        argv = psql_argv(conn, "db-1", "app", ["-c", "select 1"], tty=True)
        piped = psql_argv(conn, "db-1", "postgres", [], tty=False)
    assert argv == [
        "/usr/bin/kubectl",
        "--kubeconfig",
        "/k/admin.conf",
        "--context",
        "ctx",
        "-n",
        "shop",
        "exec",
        "-i",
        "-t",
        "db-1",
        "-c",
        "postgres",
        "--",
        "psql",
        "-h",
        "/var/run/postgresql",
        "-U",
        "postgres",
        "-d",
        "app",
        "-c",
        "select 1",
    ]
    assert "-t" not in piped[: piped.index("--")]
    assert not any("password" in a.lower() for a in argv)
