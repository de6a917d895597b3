"""The instances sub-reconciler on stand-ins (no cluster): the StatefulSet holds the size the
high-availability sub-reconciler asks for; a new cluster restoring from a source whose credentials Secret
the operator may not read gets no StatefulSet until it may, and says why; a new StatefulSet waits while
the pass has a problem; scaling is told in an Event."""

from __future__ import annotations

import asyncio
from typing import Any

from reconciler_fakes import UID, RecordedEvents, context, owned

from harness.objects import cluster_model
from pg_operator.controller.reconcilers.instances import InstancesReconciler

SOURCE = {"bucket": "backups", "path": "prod", "endpointURL": "https://s3.example.net",
          "credentials": {"secretName": "old-creds"}}  # fmt: skip
RESTORING = cluster_model(
    uid=UID, bootstrap={"recovery": {"source": {"clusterName": "orders-db", "s3": SOURCE}}}
)


def reconciler(events: RecordedEvents | None = None) -> InstancesReconciler:
    return InstancesReconciler(events or RecordedEvents(), in_cluster=True)  # type: ignore[arg-type]


def kinds(children: list[dict[str, Any]]) -> set[str]:
    return {child["kind"] for child in children}


def test_the_statefulset_holds_the_size_asked_for_during_a_scale_down() -> None:
    ctx = context(cluster=cluster_model(uid=UID, replicas=2))
    ctx.replicas = 3  # the primary has not moved off the ordinal that goes yet
    children = reconciler().children(ctx)
    assert {"StatefulSet", "Service", "ConfigMap", "NetworkPolicy"} <= kinds(children)
    statefulset = next(c for c in children if c["kind"] == "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3


def test_a_restore_waits_for_a_source_secret_the_operator_may_read() -> None:
    ctx = context(cluster=RESTORING)
    assert "StatefulSet" not in kinds(reconciler().children(ctx))
    assert ctx.problem is not None and "old-creds" in ctx.problem[1]

    labelled = owned("Secret", "old-creds", data={})  # the cache holds it: it carries the cluster's label
    ctx = context([labelled], cluster=RESTORING)
    assert "StatefulSet" in kinds(reconciler().children(ctx)) and ctx.problem is None


def test_a_new_statefulset_waits_while_the_pass_has_a_problem() -> None:
    ctx = context()
    statefulset = next(c for c in reconciler().children(ctx) if c["kind"] == "StatefulSet")
    assert not reconciler().postpone(ctx, statefulset, None)
    ctx.report(("StorageClassNotFound", "no StorageClass fast"))
    assert reconciler().postpone(ctx, statefulset, None)
    assert not reconciler().postpone(ctx, statefulset, statefulset)  # an existing one is kept up to date


def test_creating_and_scaling_are_told() -> None:
    events = RecordedEvents()
    instances, ctx = reconciler(events), context()
    desired = {"kind": "StatefulSet", "spec": {"replicas": 3}}
    assert asyncio.run(instances.applied(ctx, desired, None)) == 1
    assert asyncio.run(instances.applied(ctx, desired, {"spec": {"replicas": 2}})) == 1
    assert asyncio.run(instances.applied(ctx, desired, {"spec": {"replicas": 3}})) == 0
    assert [m for *_, m in events.posted] == [
        "created StatefulSet with 3 instance(s)",
        "scaling from 2 to 3 instance(s)",
    ]
