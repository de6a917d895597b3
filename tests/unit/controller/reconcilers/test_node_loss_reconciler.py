"""The node-loss sub-reconciler on stand-ins: an instance on a lost node makes the cluster Degraded
NodeLost naming pod and node, with one Warning Event; after the delay, with the leader elsewhere and
the other instances ready, its claim is deleted and its pod force-deleted (grace 0), each pinned to its
uid, once; the volume's node affinity decides by default; nothing happens without the nodes (a snapshot
whose nodes are None: not readable, or not listed yet)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler_fakes import NAME, UID, FakeApi, RecordedEvents, context, instance_pod, owned, primary_pod

from harness.objects import cluster_model
from pg_operator.controller.reconcilers.node_loss import NodeLossReconciler
from pg_operator.orchestration.nodes import NodeView, node_view

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
HOST = "kubernetes.io/hostname"


def node(name: str, ready: str, lost_minutes_ago: float = 10) -> dict[str, Any]:
    at = (NOW - timedelta(minutes=lost_minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": ready, "lastTransitionTime": at}
    # The node lifecycle controller's taint on a node that stopped reporting.
    taints = [] if ready == "True" else [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {HOST: name}},
            "spec": {"taints": taints}, "status": {"conditions": [condition]}}  # fmt: skip


Nodes = tuple[NodeView, ...] | None


def directory(n3: str = "Unknown", lost_minutes_ago: float = 10) -> Nodes:
    return tuple(
        node_view(n) for n in (node("n1", "True"), node("n2", "True"), node("n3", n3, lost_minutes_ago))
    )


def on(pod: dict[str, Any], node_name: str, ready: bool = True) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node_name
    if not ready:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def children(leader: str = f"{NAME}-0", renewed: datetime = NOW) -> list[dict[str, Any]]:
    leader_cm = owned("ConfigMap", f"{NAME}-leader", metadata={"annotations": {
        "leader": leader, "renewTime": renewed.isoformat(), "ttl": "20"}})  # fmt: skip
    claims = [
        owned("PersistentVolumeClaim", f"data-{NAME}-{i}", spec={"volumeName": f"pv-{i}"}) for i in range(3)
    ]
    return [on(primary_pod(), "n1"), on(instance_pod(f"{NAME}-1"), "n2"),
            on(instance_pod(f"{NAME}-2"), "n3", ready=False), leader_cm, *claims]  # fmt: skip


class VolumeApi(FakeApi):
    """The API stand-in, answering a PersistentVolume read with a node-local volume on n3."""

    def __init__(self, pinned_node: str | None = "n3") -> None:
        super().__init__()
        self.pinned_node = pinned_node
        self.volume_reads = 0
        self.delete_options: list[dict[str, Any]] = []

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        self.volume_reads += 1
        term = {"matchExpressions": [{"key": HOST, "operator": "In", "values": [self.pinned_node]}]}
        affinity = {} if self.pinned_node is None else {"required": {"nodeSelectorTerms": [term]}}

        class Volume:
            def to_dict(self) -> dict[str, Any]:
                return {"spec": {"nodeAffinity": affinity}}

        return Volume()

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None, **options: Any
    ) -> None:
        await super().delete(api_version, kind, name, namespace)
        self.delete_options.append(options)


STATEFULSET = {"spec": {"replicas": 3}}


def run(api: FakeApi, nodes: Nodes, kids: list[dict[str, Any]], cluster: Any = None,
        events: RecordedEvents | None = None,
        reconciler: NodeLossReconciler | None = None) -> Any:  # fmt: skip
    events = events or RecordedEvents()
    reconciler = reconciler or NodeLossReconciler(api, events, clock=lambda: NOW)  # type: ignore[arg-type]
    ctx = context(kids, cluster=cluster, statefulset=STATEFULSET, nodes=nodes)
    asyncio.run(reconciler.act(ctx))
    return ctx, events, reconciler


def test_a_node_local_instance_lost_past_the_delay_is_replaced_once() -> None:
    api = VolumeApi()
    ctx, events, reconciler = run(api, directory(), children())
    assert ctx.problem is not None and ctx.problem[0] == "NodeLost"
    assert f"instance {NAME}-2 is on node n3, which is Unknown (no heartbeat)" in ctx.problem[1]
    assert api.deleted == [("PersistentVolumeClaim", f"data-{NAME}-2"), ("Pod", f"{NAME}-2")]
    assert api.delete_options == [{"uid": f"uid-data-{NAME}-2", "grace_period_seconds": None},
                                  {"uid": f"uid-{NAME}-2", "grace_period_seconds": 0}]  # fmt: skip
    assert events.reasons() == ["NodeLost", "InstanceReplaced"]
    assert "its old volume pv-2 stays on n3 for its provisioner" in events.posted[1][2]
    # The cache still shows the pod in the next pass: not replaced again, no new Event.
    run(api, directory(), children(), events=events, reconciler=reconciler)
    assert len(api.deleted) == 2 and events.reasons() == ["NodeLost", "InstanceReplaced"]


def test_a_volume_that_can_follow_its_pod_waits_for_the_node_by_default() -> None:
    api = VolumeApi(pinned_node=None)
    ctx, events, _ = run(api, directory(), children())
    assert api.deleted == [] and events.reasons() == ["NodeLost"]
    assert ctx.problem is not None and "not replaced: its volume can follow it" in ctx.problem[1]
    forced = cluster_model(uid=UID, nodeLoss={"replaceInstances": True})
    run(api, directory(), children(), cluster=forced)
    assert ("Pod", f"{NAME}-2") in api.deleted


def test_before_the_delay_the_pass_comes_back_when_it_is_due() -> None:
    api = VolumeApi()
    ctx, events, _ = run(api, directory(lost_minutes_ago=1), children())
    assert api.deleted == [] and events.reasons() == ["NodeLost"]
    assert ctx.requeue_after is not None and 240 < ctx.requeue_after <= 241
    assert ctx.problem is not None and "to be replaced at 2026-01-02T12:04:00Z" in ctx.problem[1]


def test_the_leader_and_a_stale_key_are_never_replaced() -> None:
    api = VolumeApi()
    ctx, _, _ = run(api, directory(), children(leader=f"{NAME}-2"))
    assert api.deleted == [] and ctx.problem is not None and "still holds the leader key" in ctx.problem[1]
    ctx, _, _ = run(api, directory(), children(renewed=NOW - timedelta(seconds=60)))
    assert (
        api.deleted == []
        and ctx.problem is not None
        and "no instance holds a fresh leader key" in ctx.problem[1]
    )
    assert ctx.requeue_after == 10.0


def test_nothing_is_lost_on_ready_nodes_or_before_nodes_are_listed() -> None:
    api = VolumeApi()
    ctx, events, _ = run(api, directory(n3="True"), children())
    assert ctx.problem is None and api.deleted == [] and events.posted == []
    ctx, events, _ = run(api, None, children())
    assert ctx.problem is None and api.volume_reads == 0 and api.deleted == []


def test_an_instance_on_a_deleted_node_is_lost_from_when_it_was_seen_gone() -> None:
    api = VolumeApi()
    nodes = (node_view(node("n1", "True")), node_view(node("n2", "True")))  # n3's Node was deleted
    ctx, _, _ = run(api, nodes, children())
    assert ctx.problem is not None and "n3, which is gone (the Node was deleted)" in ctx.problem[1]
    assert api.deleted == []  # lost from now on: the delay starts
    assert "to be replaced at 2026-01-02T12:05:00Z" in ctx.problem[1]


def test_with_required_anti_affinity_and_no_free_node_the_instance_is_kept() -> None:
    """Three instances, one per node, anti-affinity required: the two nodes left cannot take a
    replacement, so its claim is not deleted for a pod that would stay Pending."""
    api = VolumeApi()
    term = {"labelSelector": {"matchLabels": {"app": NAME}}, "topologyKey": HOST}
    required = {"spec": {"replicas": 3, "template": {"spec": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term]}}}}}}  # fmt: skip
    events = RecordedEvents()
    reconciler = NodeLossReconciler(api, events, clock=lambda: NOW)  # type: ignore[arg-type]
    ctx = context(children(), statefulset=required, nodes=directory())
    asyncio.run(reconciler.act(ctx))
    assert api.deleted == [] and events.reasons() == ["NodeLost"]
    assert ctx.problem is not None and "not replaced while no other node can take it" in ctx.problem[1]
    assert "only 2 node(s) admit the instances" in ctx.problem[1]
