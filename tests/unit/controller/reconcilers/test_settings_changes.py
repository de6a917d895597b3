"""The settings changes of the high-availability sub-reconciler on stand-ins (no cluster, no Patroni):
a parameter value PostgreSQL refuses is checked on the primary's own binary (the value on stdin), never
sent to Patroni, reported on every pass and warned about once; a verdict is not asked again on the same
image."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from reconciler_fakes import UID, FakeExec, RecordedEvents, context, owned, primary_pod

from harness.objects import cluster_model
from pg_operator.controller.pod_exec import ExecResult
from pg_operator.controller.reconcilers.settings_changes import REFUSED_REASON, SettingsChanges
from pg_operator.orchestration.instances import instance_from_pod
from pg_operator.orchestration.parameter_check import REFUSED_MARK
from pg_operator.specs.configmap import dynamic_settings

ASKING = cluster_model(uid=UID, postgresql={"parameters": {"work_mem": "lots"}})
REFUSAL = f'{REFUSED_MARK} work_mem\nFATAL:  invalid value for parameter "work_mem": "lots"\n'


def patroni_config() -> dict[str, Any]:
    """Patroni's `<scope>-config` ConfigMap holding today's settings: all but the new parameter."""
    today = dynamic_settings(cluster_model(uid=UID))
    return owned("ConfigMap", "orders-db-config", metadata={"annotations": {"config": json.dumps(today)}})


def no_patroni() -> Any:
    raise AssertionError("a refused value must not be sent to Patroni")


def test_a_refused_value_is_checked_once_reported_and_never_sent() -> None:
    events = RecordedEvents()
    exec_ = FakeExec(lambda argv, stdin: ExecResult(0, REFUSAL, ""))
    settings = SettingsChanges(events, no_patroni, exec_)  # type: ignore[arg-type]
    primary = instance_from_pod(primary_pod())
    for _ in range(2):
        ctx = context([patroni_config(), primary_pod()], cluster=ASKING)
        asyncio.run(settings.ensure(ctx, primary, object(), None))  # type: ignore[arg-type]
        assert ctx.problem is not None and ctx.problem[0] == REFUSED_REASON
        assert "work_mem" in ctx.problem[1]
    assert len(exec_.calls) == 1  # the verdict is kept for this image
    pod, argv, stdin = exec_.calls[0]
    assert pod == "orders-db-0" and stdin == b"work_mem=lots\n" and "lots" not in " ".join(argv)
    assert events.reasons() == [REFUSED_REASON]


def test_nothing_to_change_asks_nothing() -> None:
    exec_ = FakeExec()
    settings = SettingsChanges(RecordedEvents(), no_patroni, exec_)  # type: ignore[arg-type]
    ctx = context([patroni_config(), primary_pod()])
    writes = asyncio.run(settings.ensure(ctx, instance_from_pod(primary_pod()), object(), None))  # type: ignore[arg-type]
    assert writes == 0 and exec_.calls == [] and ctx.problem is None
