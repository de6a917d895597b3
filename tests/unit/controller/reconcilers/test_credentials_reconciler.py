"""The credentials sub-reconciler on stand-ins (no cluster): passwords not yet in the database are set on
the running primary through psql's stdin, never its argv, and only then is each Secret marked applied; a
refusal is reported once and marks nothing; a missing Secret is created."""

from __future__ import annotations

import asyncio
import base64

from reconciler_fakes import UID, FakeApi, FakeExec, RecordedEvents, context, owned, primary_pod

from harness.objects import cluster_model
from pg_operator.controller.pod_exec import ExecResult
from pg_operator.controller.reconcilers.credentials import CredentialsReconciler
from pg_operator.controller.writes import WriteMemo
from pg_operator.specs import ClusterPasswords, build_secrets


def cached_secrets() -> list[dict[str, object]]:
    """The cluster's four Secrets as the cache holds them, none marked applied yet."""
    built = build_secrets(cluster_model(uid=UID), ClusterPasswords.generate())
    return [owned("Secret", s["metadata"]["name"], data=s.get("data") or {}) for s in built]


def passwords(secrets: list[dict[str, object]]) -> list[str]:
    return [base64.b64decode(s["data"]["password"]).decode() for s in secrets]  # type: ignore[index]


def test_passwords_go_to_the_primary_on_stdin_then_the_secrets_are_marked() -> None:
    api, events, exec_ = FakeApi(), RecordedEvents(), FakeExec()
    secrets = cached_secrets()
    ctx = context([*secrets, primary_pod()])
    asyncio.run(CredentialsReconciler(api, WriteMemo(), events, exec_).act(ctx))  # type: ignore[arg-type]

    assert len(exec_.calls) == 1
    pod, argv, stdin = exec_.calls[0]
    assert pod == "orders-db-0" and "psql" in argv
    text = " ".join(argv) + stdin.decode()
    assert "SCRAM-SHA-256$" in stdin.decode()  # verifiers, sent on stdin
    assert not any(p in text for p in passwords(secrets))  # never a password itself
    assert sorted(name for name, _ in api.patched) == sorted(s["metadata"]["name"] for s in secrets)  # type: ignore[index]
    assert all(patch["metadata"]["uid"] for _, patch in api.patched)  # pinned to the Secret observed
    assert events.reasons() == ["CredentialApplied"] * 4
    assert ctx.problem is None


def test_a_refused_password_is_reported_once_and_nothing_is_marked() -> None:
    api, events = FakeApi(), RecordedEvents()
    exec_ = FakeExec(lambda argv, stdin: ExecResult(1, "", "ERROR:  permission denied"))
    reconciler = CredentialsReconciler(api, WriteMemo(), events, exec_)  # type: ignore[arg-type]
    secrets = cached_secrets()
    for _ in range(2):
        ctx = context([*secrets, primary_pod()])
        asyncio.run(reconciler.act(ctx))
        assert ctx.problem is not None and ctx.problem[0] == "CredentialNotApplied"
        assert "permission denied" in ctx.problem[1]
    assert api.patched == []
    assert events.reasons() == ["CredentialNotApplied"]  # one Warning for the same message


def test_without_a_running_primary_nothing_is_tried() -> None:
    api, events, exec_ = FakeApi(), RecordedEvents(), FakeExec()
    ctx = context(cached_secrets())
    asyncio.run(CredentialsReconciler(api, WriteMemo(), events, exec_).act(ctx))  # type: ignore[arg-type]
    assert exec_.calls == [] and api.patched == [] and ctx.problem is None


def test_missing_secrets_are_created_once_until_the_cache_shows_them() -> None:
    api, events = FakeApi(), RecordedEvents()
    reconciler = CredentialsReconciler(api, WriteMemo(), events, None)  # type: ignore[arg-type]
    present = cached_secrets()[:2]
    ctx = context(present)
    writes = asyncio.run(reconciler.create(ctx))
    assert writes == 2
    assert sorted(s["metadata"]["name"] for s in api.created) == ["orders-db-app", "orders-db-patroni-api"]
    assert ("v1", "Secret", "orders-db-superuser") in ctx.wanted
    assert asyncio.run(reconciler.create(context(present))) == 0  # written a moment ago: not again
