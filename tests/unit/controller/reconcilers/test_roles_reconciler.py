"""The roles sub-reconciler on stand-ins (no cluster): what the database lacks is read on the running
primary, the converging script applied there in one psql session and told in one Event; the next pass
with nothing new does not ask again; a script the database refuses is reported once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from reconciler_fakes import UID, FakeApi, FakeExec, RecordedEvents, context, primary_pod

from harness.objects import cluster_model
from pg_operator.controller.pod_exec import ExecResult
from pg_operator.controller.reconcilers.roles import RolesReconciler
from pg_operator.controller.writes import WriteMemo

# A database owned by the application owner: no role of its own, so no password Secret is involved.
DECLARING = cluster_model(uid=UID, databases=[{"name": "orders", "owner": "app"}])


def role(name: str) -> dict[str, Any]:
    flags = {"login": True, "createdb": False, "createrole": False, "inherit": True, "superuser": False,
             "replication": False, "bypassrls": False}  # fmt: skip
    return {"name": name, **flags, "connectionLimit": -1, "validUntil": None, "managed": False,
            "verifier": None, "memberOf": [], "adminOf": []}  # fmt: skip


# What the read-back prints on a fresh cluster: the application owner, no declared database yet.
FRESH = "\n".join(
    json.dumps(part)
    for part in (
        {"part": "roles", "items": [role("app")]},
        {"part": "databases", "items": []},
        {"part": "extensions", "available": [], "trusted": []},
        {"part": "reads", "as": "pgop_monitor", "databases": []},
    )
)


def answering(apply_status: int) -> FakeExec:
    def answer(argv: list[str], stdin: bytes) -> ExecResult:
        if b"CREATE DATABASE" in stdin:
            return ExecResult(apply_status, "", "" if apply_status == 0 else "ERROR:  permission denied")
        return ExecResult(0, FRESH, "")  # the read-back

    return FakeExec(answer)


def test_a_missing_database_is_created_on_the_primary_and_told_once() -> None:
    exec_, events = answering(0), RecordedEvents()
    roles = RolesReconciler(FakeApi(), WriteMemo(), events, exec_)  # type: ignore[arg-type]
    ctx = context([primary_pod()], cluster=DECLARING)
    asyncio.run(roles.act(ctx))
    scripts = [stdin.decode() for _, _, stdin in exec_.calls]
    assert len(scripts) == 2  # the read-back, then the script
    assert 'CREATE DATABASE "orders" OWNER "app"' in scripts[1]
    assert all(pod == "orders-db-0" for pod, _, _ in exec_.calls)
    assert events.reasons() == ["RolesConverged"] and "created database orders" in events.posted[0][2]
    assert ctx.problem is None and ctx.requeue_after is not None  # checked again later, not watched

    asyncio.run(roles.act(context([primary_pod()], cluster=DECLARING)))
    assert len(exec_.calls) == 2  # nothing new since: not asked again yet


def test_a_script_the_database_refuses_is_warned_about_once() -> None:
    exec_, events = answering(1), RecordedEvents()
    roles = RolesReconciler(FakeApi(), WriteMemo(), events, exec_)  # type: ignore[arg-type]
    asyncio.run(roles.act(context([primary_pod()], cluster=DECLARING)))
    assert events.reasons() == ["RolesNotApplied"]
    assert "permission denied" in events.posted[0][2]


def test_a_cluster_declaring_nothing_costs_no_exec() -> None:
    exec_ = answering(0)
    roles = RolesReconciler(FakeApi(), WriteMemo(), RecordedEvents(), exec_)  # type: ignore[arg-type]
    asyncio.run(roles.act(context([primary_pod()])))
    assert exec_.calls == []
