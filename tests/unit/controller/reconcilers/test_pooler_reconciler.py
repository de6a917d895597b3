"""The pooler sub-reconciler around a switchover, with stand-ins for the pod exec and the API (no cluster):
every
paused pod is resumed on every path, pointed at the new primary when there is one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from harness.objects import cluster_model
from harness.pods import instance_pod
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.pod_exec import ExecError, ExecResult
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.pooler import PoolerReconciler
from pg_operator.controller.writes import WriteMemo


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.patched: list[tuple[str, dict[str, Any]]] = []

    async def list_metadata(self, path: str,
                            params: Mapping[str, str]) -> AsyncIterator[list[dict[str, Any]]]:  # fmt: skip
        yield self.pods

    async def merge_patch(self, res: Any, name: str, namespace: str, patch: dict[str, Any]) -> None:
        self.patched.append((name, patch))


class FakeExec:
    def __init__(self, broken: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.broken = broken  # (pod, command word) pairs that fail

    async def run(self, namespace: str, pod: str, argv: list[str], **_: Any) -> ExecResult:
        word = "psql" if "psql" in argv[:3] else argv[1]
        self.calls.append((pod, (word, *argv[2:])))
        if (pod, word) in self.broken:
            raise ExecError("container not running")
        if word == "psql":
            return ExecResult(0, "f\n", "")
        return ExecResult(0, f"{word} done\n", "")


def pod(name: str, side: str = "rw") -> dict[str, Any]:
    labels = {"db.example.com/pooler": "orders-db", "db.example.com/pooler-side": side}
    return {"name": name, "labels": labels}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def context_for(mode: str = "transaction") -> ReconcileContext:
    cluster = cluster_model(pooler={"mode": mode, "readOnly": True})
    return ReconcileContext({"metadata": {"name": "orders-db"}}, cluster, Snapshot(None), None)


def reconciler(api: FakeApi, exec_: FakeExec) -> PoolerReconciler:
    return PoolerReconciler(api, WriteMemo(), None, exec_)  # type: ignore[arg-type]


def test_paused_then_pointed_at_the_new_primary_and_resumed_in_one_exec() -> None:
    api, exec_ = FakeApi([pod("a"), pod("b"), pod("r", "ro")]), FakeExec()
    r, ctx = reconciler(api, exec_), context_for()

    async def switchover() -> None:
        paused = await r.pause(ctx)
        assert paused is not None and paused.pods == ["a", "b"]  # the ro side is never paused
        await paused.resume("orders-db-1")
        await paused.resume("orders-db-1")  # a second resume does nothing

    run(switchover())
    host = "orders-db-1.orders-db.shop.svc"
    assert [c for c in exec_.calls if c[0] == "a"] == [
        ("a", ("pause", "30")),
        ("a", ("point", host, "--resume")),
    ]
    order = [(c[0], c[1][0]) for c in exec_.calls]
    assert order.index(("orders-db-1", "psql")) < order.index(("a", "point"))  # writable first
    assert sorted(name for name, _ in api.patched) == ["a", "b"]
    assert api.patched[0][1] == {"metadata": {"annotations": {"db.example.com/pooler-points-to": host}}}


def test_a_failed_switchover_resumes_without_pointing() -> None:
    api, exec_ = FakeApi([pod("a")]), FakeExec()
    r, ctx = reconciler(api, exec_), context_for()

    async def switchover() -> None:
        paused = await r.pause(ctx)
        assert paused is not None
        await paused.resume(None)

    run(switchover())
    assert exec_.calls == [("a", ("pause", "30")), ("a", ("resume",))]
    assert api.patched == []


def test_a_pod_that_cannot_be_pointed_is_resumed_as_it_was() -> None:
    api, exec_ = FakeApi([pod("a"), pod("b")]), FakeExec(broken={("b", "point")})
    r, ctx = reconciler(api, exec_), context_for()

    async def switchover() -> None:
        paused = await r.pause(ctx)
        assert paused is not None
        await paused.resume("orders-db-2")

    run(switchover())
    assert ("b", ("resume",)) in exec_.calls
    assert [name for name, _ in api.patched] == ["a"]


def test_a_pod_that_cannot_be_paused_is_resumed_and_left_out() -> None:
    api, exec_ = FakeApi([pod("a"), pod("b")]), FakeExec(broken={("b", "pause")})
    r, ctx = reconciler(api, exec_), context_for()
    paused = run(r.pause(ctx))
    assert paused is not None and paused.pods == ["a"]
    assert ("b", ("resume",)) in exec_.calls


def test_session_mode_and_no_pods_pause_nothing() -> None:
    exec_ = FakeExec()
    assert run(reconciler(FakeApi([pod("a")]), exec_).pause(context_for("session"))) is None
    assert run(reconciler(FakeApi([]), exec_).pause(context_for())) is None
    assert exec_.calls == []


# --- the pooler turned off: its auth role leaves the database before its Secret goes -----------------------

AUTH = ("v1", "Secret", "orders-db-pooler-auth")


class TeardownExec:
    def __init__(self, fail: bool = False) -> None:
        self.scripts: list[str] = []
        self.fail = fail

    async def run(self, namespace: str, pod: str, argv: list[str], *, stdin: bytes | None = None,
                  **_: Any) -> ExecResult:  # fmt: skip
        if stdin is None:  # the database listing
            return ExecResult(0, "app\npostgres\ntemplate1\n", "")
        self.scripts.append(f"{pod}:{stdin.decode()}")
        return ExecResult(1, "", "ERROR:  role is in use") if self.fail else ExecResult(0, "", "")


def off_context(with_secret: bool = True) -> ReconcileContext:
    primary = instance_pod("orders-db-0", role="primary")
    primary["metadata"]["labels"]["db.example.com/cluster"] = "orders-db"
    primary["metadata"]["annotations"] = {"status": '{"role": "primary", "state": "running"}'}
    children: dict[tuple[str, str], list[dict[str, Any]]] = {("v1", "Pod"): [primary]}
    if with_secret:
        children[("v1", "Secret")] = [{"metadata": {"name": "orders-db-pooler-auth"}}]
    return ReconcileContext(
        {"metadata": {"name": "orders-db"}}, cluster_model(), Snapshot(None, children), None
    )


def test_turned_off_the_role_and_lookups_are_dropped_then_the_secret_may_go() -> None:
    exec_, ctx = TeardownExec(), off_context()
    run(reconciler(FakeApi([]), exec_).act(ctx))  # type: ignore[arg-type]
    [script] = exec_.scripts
    assert script.startswith("orders-db-0:")
    assert script.count('DROP SCHEMA IF EXISTS "pgop_pooler" CASCADE') == 3  # app, postgres, template1
    assert script.rstrip().endswith('DROP ROLE IF EXISTS "pgop_pooler";')
    assert AUTH not in ctx.wanted and ctx.requeue_after is None


def test_turned_off_a_failed_drop_keeps_the_secret_and_tries_again() -> None:
    exec_, ctx = TeardownExec(fail=True), off_context()
    run(reconciler(FakeApi([]), exec_).act(ctx))  # type: ignore[arg-type]
    assert len(exec_.scripts) == 1
    assert AUTH in ctx.wanted and ctx.requeue_after is not None


def test_a_cluster_that_never_had_a_pooler_costs_nothing() -> None:
    exec_, ctx = TeardownExec(), off_context(with_secret=False)
    run(reconciler(FakeApi([]), exec_).act(ctx))  # type: ignore[arg-type]
    assert exec_.scripts == [] and AUTH not in ctx.wanted
