"""The roles read-back's split between the superuser (in `postgres`) and the read role (inside the
declared databases, which tenants own): the script's shape, and its output read back when a database
refuses the read role, when psql stopped at one, and on an instance whose pg_hba does not admit it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs.role_changes import converge
from pg_operator.specs.role_reads import (
    READ_ROLE,
    ObservationError,
    observe_sql,
    observed_of,
    parse_observed,
    read_order,
)
from pg_operator.specs.roles import Passwords


def cluster(*databases: str) -> PostgresCluster:
    spec = {
        "replicas": 1,
        "version": "16",
        "storage": "1Gi",
        "roles": [{"name": "alice"}],
        "databases": [
            {"name": db, "owner": "alice", "extensions": ["pg_trgm"], "schemas": [{"name": "sales"}]}
            for db in databases
        ],
    }
    return PostgresCluster.from_obj(
        {"metadata": {"name": "db", "namespace": "ns", "uid": "u", "generation": 1}, "spec": spec}
    )


def output(reads: list[dict[str, Any]], details: list[str], read_as: str = READ_ROLE) -> str:
    role = {"name": "alice", "login": True, "createdb": False, "createrole": False, "inherit": True,
            "superuser": False, "replication": False, "bypassrls": False, "connectionLimit": -1,
            "validUntil": None, "managed": True, "memberOf": [], "adminOf": []}  # fmt: skip
    dbs = [{"name": r["name"], "owner": "alice", "encoding": "UTF8", "collate": "C", "allowConnections": True,
            "managed": True} for r in reads]  # fmt: skip
    lines = [
        {"part": "roles", "items": [role]},
        {"part": "databases", "items": dbs},
        {"part": "extensions", "available": ["pg_trgm"], "trusted": ["pg_trgm"]},
        {"part": "reads", "as": read_as, "databases": reads},
        *(
            {"part": "database", "name": name, "readAs": read_as, "extensions": ["plpgsql", "pg_trgm"],
             "schemas": {"sales": "alice"}, "extensionSchema": None}
            for name in details
        ),
    ]  # fmt: skip
    return "\n".join(json.dumps(line) for line in lines)


def test_the_superuser_stays_in_postgres_and_each_declared_database_is_entered_as_the_read_role() -> None:
    sql = observe_sql(cluster("alicedb", "bobdb"))
    head, _, tail = sql.partition("\\if :pgop_read_")
    # Everything the superuser reads comes before the first \connect (its session is in `postgres`).
    assert "\\connect" not in head and "pg_catalog.pg_authid" in head
    assert "pg_catalog.pg_hba_file_rules" in head and "pg_catalog.has_database_privilege" in head
    # Inside: the read role, pinned with what an unprivileged role may set, and pg_roles, not pg_authid.
    for db in ("alicedb", "bobdb"):
        assert f"\\if :pgop_admitted\n\\connect {db} {READ_ROLE}\nSET ROLE NONE;\nSET search_path = " in tail
    assert "pg_authid" not in tail and "log_statement" not in tail.split("\\else")[0]


def test_databases_not_read_last_time_are_read_last() -> None:
    c = cluster("alicedb", "bobdb", "caroldb")
    assert read_order(c) == ["alicedb", "bobdb", "caroldb"]
    assert read_order(c, {"alicedb"}) == ["bobdb", "caroldb", "alicedb"]
    sql = observe_sql(c, {"alicedb"})
    assert sql.index("\\connect bobdb ") < sql.index("\\connect caroldb ") < sql.index("\\connect alicedb ")


def test_a_database_the_read_role_may_not_enter_is_reported_and_nothing_is_planned_inside_it() -> None:
    reason = f"{READ_ROLE} may not connect to it: CONNECT is granted neither to it nor to PUBLIC"
    reads = [
        {"name": "alicedb", "read": False, "reason": reason},
        {"name": "bobdb", "read": True, "reason": None},
    ]
    c = cluster("alicedb", "bobdb")
    seen = parse_observed(output(reads, ["bobdb"]))
    assert seen.databases["alicedb"].unread == reason and seen.databases["alicedb"].extensions is None
    assert seen.databases["bobdb"].unread is None and seen.stopped_at is None
    plan = converge(c, seen, Passwords())
    entries = {e.name: e for e in plan.databases}
    assert not entries["alicedb"].applied and reason in entries["alicedb"].reason
    assert entries["bobdb"].applied
    assert "\\connect alicedb" not in plan.sql


def test_where_the_read_role_was_refused_at_login_the_read_stopped_and_says_why() -> None:
    reads = [{"name": n, "read": True, "reason": None} for n in ("alicedb", "bobdb", "caroldb")]
    stderr = (
        'psql:<stdin>:12: error: \\connect: connection to server on socket "/var/run/postgresql/.s.PGSQL"'
        ' failed: FATAL:  too many connections for database "bobdb"\n'
    )
    seen = parse_observed(output(reads, ["alicedb"]), stderr)
    assert seen.stopped_at == "bobdb"
    assert seen.databases["bobdb"].unread == (
        f'{READ_ROLE} could not read it: too many connections for database "bobdb"'
    )
    assert seen.databases["caroldb"].unread == "not read this time: the read stopped at database bobdb"
    assert seen.databases["alicedb"].unread is None and seen.databases["alicedb"].schemas == {
        "sales": "alice"
    }


def test_an_instance_whose_pg_hba_does_not_admit_the_read_role_is_read_as_before() -> None:
    reads = [{"name": "alicedb", "read": True, "reason": None}]
    seen = parse_observed(output(reads, ["alicedb"], read_as="postgres"))
    assert seen.databases_read_as == "postgres" and seen.databases["alicedb"].unread is None
    assert converge(cluster("alicedb"), seen, Passwords()).databases[0].applied


def test_a_failed_read_fails_the_check_unless_it_stopped_at_a_database_that_refused_the_read_role() -> None:
    reads = [{"name": n, "read": True, "reason": None} for n in ("alicedb", "bobdb")]
    refused = 'psql:<stdin>:9: error: \\connect: … failed: FATAL:  permission denied for database "bobdb"\n'
    stopped = observed_of(2, output(reads, ["alicedb"]), refused)
    assert stopped is not None and stopped.stopped_at == "bobdb"
    # Every database read, and still psql failed: something else went wrong.
    assert observed_of(3, output(reads, ["alicedb", "bobdb"]), "ERROR:  out of memory\n") is None
    # The superuser's part did not finish.
    assert observed_of(3, output(reads, [])[:40], "ERROR:  canceling statement\n") is None
    with pytest.raises(ObservationError):
        observed_of(0, '{"part": "roles", "items": []}', "")
