"""The node-loss sub-reconciler: an instance whose node is lost (NotReady, no heartbeat, or deleted) is
reported — Degraded `NodeLost` naming the pod and the node, one Warning Event — and, when the policy
allows and it is safe, replaced on another node after `spec.nodeLoss.after`
(orchestration/node_loss.py says when; docs/high-availability.md what it costs).

Replacing is two deletes, each pinned to the uid the pass saw: the instance's data claim (its
pvc-protection finalizer holds it until the pod is gone), then the pod with grace period 0, since its
kubelet will never confirm its end. The StatefulSet then recreates the pod and a new claim; the
scheduler places it on a Ready node (the lost one carries the unreachable or not-ready taint), the
provisioner makes a new empty volume, and Patroni clones the member from the primary. The old
PersistentVolume is the provisioner's: never deleted here, named in the Event.

Nodes come from the snapshot (`Snapshot.nodes`: the Node informer's views, controller/nodes.py; None when
the operator may not read Nodes, and then nothing is reported); whether a volume is pinned to its node is
read from its PersistentVolume, by name, only once an instance is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.constants import DATA_VOLUME
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.kube_api import Api, is_conflict, is_not_found, resource_for
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.writes import uid_refused
from pg_operator.orchestration.failover import leader_configmap_name
from pg_operator.orchestration.node_loss import (
    LostInstance,
    Replacement,
    Verdict,
    leader_key,
    lost_instances,
    pinned_to,
    plan_replacement,
    problem_message,
)
from pg_operator.orchestration.nodes import NodeHealth, Readiness
from pg_operator.specs.placement import too_few_nodes

log = logging.getLogger(__name__)

NODE_LOST_REASON = "NodeLost"
REPLACED_REASON = "InstanceReplaced"
# While an instance is lost and its replacement held (the leader key not fresh, another instance not
# ready), look again this often: the leader key's renewals wake no pass.
HOLD_RECHECK_SECONDS = 10.0


@dataclass
class Remembered:
    """What the sub-reconciler remembers of one cluster between passes."""

    # Nodes seen gone (their Node deleted), with when: their instances' loss is timed from then.
    gone_since: dict[str, datetime] = field(default_factory=dict)
    # Whether each PersistentVolume read is pinned to one node (a volume's node affinity is immutable).
    pinned: dict[str, bool | None] = field(default_factory=dict)
    # The uids of the pods replaced: a pass the cache has not caught up with must not replace them again.
    replaced: set[str] = field(default_factory=set)


def claim_name(pod: str) -> str:
    return f"{DATA_VOLUME}-{pod}"


def is_ready(pod: Mapping[str, Any]) -> bool:
    return objects.condition_status(objects.status(pod), "Ready") == "True" and not objects.deleting(pod)


class NodeLossReconciler(SubReconciler):
    def __init__(self, api: Api, events: EventRecorder,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:  # fmt: skip
        self.api = api
        self.events = events
        self.clock = clock
        self._warned = OncePerMessage(events)
        self._memory: ClusterMemory[Remembered] = ClusterMemory(Remembered)

    def _node_view(
        self, ctx: ReconcileContext, pods: list[dict[str, Any]], now: datetime
    ) -> dict[str, NodeHealth]:
        """The health of every node the instances are bound to; a node no longer there is gone since the
        first pass that saw it so."""
        memory = self._memory.of(ctx.key)
        view: dict[str, NodeHealth] = {}
        for node in {str(objects.spec(p).get("nodeName") or "") for p in pods} - {""}:
            seen = ctx.snapshot.node(node)
            health = seen.health if seen is not None else None
            if health is None:
                since = memory.gone_since.setdefault(node, now)
                health = NodeHealth(node, Readiness.GONE, since)
            else:
                memory.gone_since.pop(node, None)
            view[node] = health
        return view

    async def act(self, ctx: ReconcileContext) -> None:
        # A hibernating cluster's pods stop and start on purpose: none is replaced (reconcilers/lifecycle.py).
        if ctx.snapshot.nodes is None or ctx.hibernating:
            return
        now = self.clock()
        pods = ctx.snapshot.of_kind("v1", "Pod")
        view = self._node_view(ctx, pods, now)
        memory = self._memory.of(ctx.key)
        lost = [i for i in lost_instances(pods, view) if i.uid not in memory.replaced]
        if not lost:
            self._warned.forget(ctx.key)
            if not memory.gone_since and not any(h.lost for h in view.values()):
                self._memory.drop(ctx.key)
            return
        ctx.writes += await self._warned.warn(ctx.body, NODE_LOST_REASON, problem_message(lost))
        plans = [await self._plan(ctx, pods, lost, one, now) for one in lost]
        ctx.report((NODE_LOST_REASON, "; ".join(f"{p.instance.message()}: {p.reason}" for p in plans)))
        for plan in plans:
            if plan.verdict is Verdict.WAIT:
                ctx.again_in(plan.wait_seconds + 1)
            elif plan.verdict is Verdict.HOLD:
                ctx.again_in(HOLD_RECHECK_SECONDS)
        due = next((p for p in plans if p.verdict is Verdict.REPLACE), None)
        if due is not None:
            ctx.writes += await self._replace(ctx, due.instance, due.reason)
            ctx.again_in(HOLD_RECHECK_SECONDS)

    async def _plan(self, ctx: ReconcileContext, pods: list[dict[str, Any]], lost: list[LostInstance],
                    one: LostInstance, now: datetime) -> Replacement:  # fmt: skip
        policy = ctx.cluster.spec.node_loss
        pinned = None if policy.replace_instances is not None else await self._pinned(ctx, one)
        replicas = objects.spec(ctx.statefulset).get("replicas") if ctx.statefulset is not None else None
        leader_configmap = ctx.snapshot.find("v1", "ConfigMap", leader_configmap_name(ctx.name))
        plan = plan_replacement(
            one,
            policy=policy,
            pinned=pinned,
            leader=leader_key(leader_configmap, ctx.cluster.spec.patroni.ttl),
            ready={objects.name(p): is_ready(p) for p in pods},
            replicas=int(replicas if replicas is not None else ctx.cluster.spec.replicas),
            lost_names=frozenset(i.pod for i in lost),
            now=now,
        )
        if plan.verdict is Verdict.REPLACE:
            short = too_few_nodes(ctx.cluster, ctx.statefulset, ctx.snapshot.nodes)
            if short is not None:
                # A replacement would stay Pending, its claim deleted for nothing: keep the instance until a
                # node can take it (the node returns, one is added, or anti-affinity becomes preferred).
                return Replacement(
                    Verdict.HOLD, one, f"not replaced while no other node can take it: {short}"
                )
        if plan.verdict is Verdict.WAIT:
            due = now + timedelta(seconds=plan.wait_seconds)
            # A reason that stays the same from pass to pass: the status is written once, not every pass.
            return Replacement(plan.verdict, one, f"to be replaced at {due:%Y-%m-%dT%H:%M:%SZ}",
                               plan.wait_seconds)  # fmt: skip
        return plan

    async def _pinned(self, ctx: ReconcileContext, lost: LostInstance) -> bool | None:
        """Whether the lost instance's volume is pinned to its node (None: unknown — no claim, no bound
        volume, or the volume could not be read)."""
        claim = ctx.snapshot.find("v1", "PersistentVolumeClaim", claim_name(lost.pod))
        volume_name = str(objects.spec(claim).get("volumeName") or "")
        if not volume_name:
            return None
        memory = self._memory.of(ctx.key)
        if volume_name not in memory.pinned:
            try:
                volume = await self.api.get(resource_for("v1", "PersistentVolume"), volume_name)
                memory.pinned[volume_name] = pinned_to(volume.to_dict(), lost.node)
            except ApiError as exc:
                log.warning("%s/%s: could not read PersistentVolume %s of %s: %s", ctx.namespace, ctx.name,
                            volume_name, lost.pod, exc)  # fmt: skip
                return None
        return memory.pinned[volume_name]

    async def _replace(self, ctx: ReconcileContext, lost: LostInstance, why: str) -> int:
        """Delete the lost instance's claim, then force-delete its pod (each pinned to the uid seen): the
        StatefulSet recreates both elsewhere. The writes made."""
        claim = ctx.snapshot.find("v1", "PersistentVolumeClaim", claim_name(lost.pod))
        writes = 0
        volume = ""
        if claim is not None:
            volume = str(objects.spec(claim).get("volumeName") or "")
            if not objects.deleting(claim):
                writes += await self._delete(ctx, "PersistentVolumeClaim", claim_name(lost.pod),
                                             objects.uid(claim))  # fmt: skip
        if not await self._delete(ctx, "Pod", lost.pod, lost.uid, grace_period_seconds=0):
            return writes
        self._memory.of(ctx.key).replaced.add(lost.uid)
        old_volume = f"; its old volume {volume} stays on {lost.node} for its provisioner" if volume else ""
        message = (f"{lost.message()}: replaced ({why}): pod force-deleted and claim {claim_name(lost.pod)} "
                   f"deleted, so the StatefulSet recreates it on another node with a new volume that Patroni "
                   f"clones from the primary{old_volume}")  # fmt: skip
        log.warning("%s/%s: %s", ctx.namespace, ctx.name, message)
        return writes + 1 + int(await self.events.record(ctx.body, "Warning", REPLACED_REASON, message))

    async def _delete(self, ctx: ReconcileContext, kind: str, name: str, uid: str,
                      grace_period_seconds: int | None = None) -> bool:  # fmt: skip
        try:
            await self.api.delete("v1", kind, name, ctx.namespace, uid=uid,
                                  grace_period_seconds=grace_period_seconds)  # fmt: skip
        except ApiError as exc:
            if is_not_found(exc) or is_conflict(exc) or uid_refused(exc):
                return False  # gone or replaced meanwhile: the next pass sees what is there
            raise
        return True
