"""The instances sub-reconciler: the children that run PostgreSQL (instance RBAC, configuration, Services, the
StatefulSet, its disruption budget, its NetworkPolicy), the Events that say when the StatefulSet was
created or scaled, and why an instance pod is stuck.

A stuck pod (orchestration/stuck_pods.py: an image that cannot be pulled, a crash loop, a container that
cannot be created, a pod no node takes, a volume claim nothing binds) is reported after every other
sub-reconciler has acted, and its precedence is:

- A problem another sub-reconciler already reported wins the Degraded condition: those name a cause in
  the spec or in another object (a missing StorageClass, a refused Secret or setting, a major upgrade
  that failed, a foreign object in the way), often the very reason the pod is stuck.
- One exception: a halted rollout (the high-availability sub-reconciler's `RolloutHalted`) only says an
  instance did not become ready; the stuck pod says why, so it takes its place.
- It wins over what the status would say of its own (`NoPrimary`, `InstancesNotReady`, `Progressing`
  `Creating` with Degraded False): those only say an instance is not ready.
- Either way each distinct cause (pod, container, reason, image or claim) gets one Warning Event when it
  is first seen, whether or not it won the condition, and again only after it went away and came back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pg_operator import objects
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.store_limits import limits as store_limits
from pg_operator.orchestration.instance_pods import foreign_pod_message
from pg_operator.orchestration.stuck_pods import problem, recheck_in, stuck_pods
from pg_operator.specs import desired_children
from pg_operator.specs.backup_pod import recovery_refusals, wired_for_pods
from pg_operator.specs.network_policy import (
    DEFAULT_MONITORING_NAMESPACE,
    DEFAULT_OPERATOR_NAMESPACE,
    OperatorPeer,
    host_cidrs,
)

# The high-availability sub-reconciler's reason for a rollout stopped at an instance that is not ready.
ROLLOUT_HALTED = "RolloutHalted"

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace() -> str:
    """The namespace of the operator's pods (deploy/ sets POD_NAMESPACE)."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return DEFAULT_OPERATOR_NAMESPACE


def runs_in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def instance_host_ips(pods: list[dict[str, Any]]) -> list[str]:
    """The node addresses the cluster's pods run on (status.hostIPs, or hostIP on older servers)."""
    ips = []
    for pod in pods:
        status = pod.get("status") or {}
        ips += [entry.get("ip", "") for entry in status.get("hostIPs") or []] or [status.get("hostIP", "")]
    return [ip for ip in ips if ip]


class InstancesReconciler(SubReconciler):
    def __init__(self, events: EventRecorder, *, in_cluster: bool | None = None,
                 monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE) -> None:  # fmt: skip
        self.events = events
        self._foreign_warned = OncePerMessage(events)
        # The stuck-pod causes each cluster's Warning Events have told (StuckPod.identity), while they last.
        self._stuck_told: ClusterMemory[set[tuple[str, str, str, str]]] = ClusterMemory(set)
        self.operator_namespace = operator_namespace()
        self.monitoring_namespace = monitoring_namespace  # whose pods may scrape by default
        # Outside the cluster the operator connects from a node's host network (a pod selector cannot
        # name it): the policy then also admits the addresses of the nodes the instances run on.
        self.in_cluster = runs_in_cluster() if in_cluster is None else in_cluster

    async def follow_up(self, ctx: ReconcileContext) -> int:
        if ctx.hibernating:  # pods stopping or starting on purpose are not stuck (reconcilers/lifecycle.py)
            return await self._report_foreign(ctx)
        return await self._report_stuck(ctx) + await self._report_foreign(ctx)

    async def _report_foreign(self, ctx: ReconcileContext) -> int:
        """Pods that carry the cluster's labels but are none of its instances (a tenant's look-alikes) are
        ignored everywhere; one Warning names them, again only when the set changes."""
        key = (ctx.namespace, ctx.name)
        foreign = sorted(ctx.snapshot.foreign_pods)
        if not foreign:
            self._foreign_warned.forget(key)
            return 0
        message = "; ".join(foreign_pod_message(name, ctx.name) for name in foreign)
        return await self._foreign_warned.warn(ctx.body, "ForeignPod", message)

    async def _report_stuck(self, ctx: ReconcileContext) -> int:
        """Instance pods that cannot run: Degraded with the first one's reason (unless a problem reported
        before wins, see the module's docstring) and one Warning Event per new cause."""
        pods = ctx.snapshot.of_kind("v1", "Pod")
        claims = ctx.snapshot.of_kind("v1", "PersistentVolumeClaim")
        now = datetime.now(UTC)
        stuck = stuck_pods(pods, claims, now)
        wait = recheck_in(pods, claims, now)
        if wait is not None:
            ctx.again_in(wait)  # a wait counts once it has lasted, a moment no watch event announces
        found = problem(stuck)
        if found is not None:
            if ctx.problem is None:
                ctx.problem = found
            elif ctx.problem[0] == ROLLOUT_HALTED:
                ctx.problem = (found[0], f"{found[1]}; the rollout is halted")
        told = (self._stuck_told.drop(ctx.key) or set()) & {s.identity for s in stuck}  # gone and back: news
        writes = 0
        for s in stuck:
            if s.identity not in told:
                told.add(s.identity)
                writes += int(await self.events.record(ctx.body, "Warning", s.reason.value, s.message))
        if told:
            self._stuck_told.set(ctx.key, told)
        return writes

    def operator_peer(self, ctx: ReconcileContext) -> OperatorPeer:
        if self.in_cluster:
            return OperatorPeer(self.operator_namespace, monitoring_namespace=self.monitoring_namespace)
        pods = ctx.snapshot.of_kind("v1", "Pod")
        return OperatorPeer(
            self.operator_namespace, host_cidrs(instance_host_ips(pods)), self.monitoring_namespace
        )

    def children(self, ctx: ReconcileContext) -> list[dict[str, Any]]:
        operator = self.operator_peer(ctx)
        # A refused spec.backup or recovery source (plain HTTP, an unlabelled Secret) is not wired into the
        # pods; a new cluster whose recovery source is refused gets no StatefulSet until it is right.
        allow_insecure = store_limits().allow_insecure

        def labelled(name: str) -> bool:  # the cache holds a Secret here only with this cluster's label
            return ctx.snapshot.find("v1", "Secret", name) is not None

        cluster = wired_for_pods(ctx.cluster, allow_insecure=allow_insecure, labelled=labelled)
        desired = desired_children(cluster, existing_statefulset=ctx.statefulset, operator=operator,
                                   nodes=ctx.snapshot.nodes, fenced=ctx.fenced)  # fmt: skip
        refused = recovery_refusals(ctx.cluster, allow_insecure=allow_insecure, labelled=labelled)
        if refused and ctx.statefulset is None:
            ctx.report(refused[0].as_problem())
            desired = [child for child in desired if child["kind"] != "StatefulSet"]
        if ctx.replicas is not None:
            # The high-availability sub-reconciler holds the size until the primary has moved (scale-down).
            for child in desired:
                if child["kind"] == "StatefulSet":
                    child["spec"]["replicas"] = ctx.replicas
        return desired

    def postpone(
        self, ctx: ReconcileContext, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> bool:
        # Its volumes could not be provisioned (say, no such StorageClass): create it once they can.
        return desired["kind"] == "StatefulSet" and observed is None and ctx.problem is not None

    async def applied(
        self, ctx: ReconcileContext, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> int:
        if desired["kind"] != "StatefulSet":
            return 0
        want = objects.spec(desired).get("replicas")
        if observed is None:
            message = f"created StatefulSet with {want} instance(s)"
            return int(await self.events.record(ctx.body, "Normal", "Created", message))
        have = objects.spec(observed).get("replicas")
        if want is not None and have is not None and want != have:
            message = f"scaling from {have} to {want} instance(s)"
            return int(await self.events.record(ctx.body, "Normal", "Scaled", message))
        return 0
