"""The instances sub-reconciler: the children that run PostgreSQL (instance RBAC, configuration, Services, the
StatefulSet, its disruption budget, its NetworkPolicy), and the Events that say when the StatefulSet was
created or scaled."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pg_operator import objects
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.store_limits import limits as store_limits
from pg_operator.orchestration.instance_pods import foreign_pod_message
from pg_operator.specs import desired_children
from pg_operator.specs.backup_pod import recovery_refusals, wired_for_pods
from pg_operator.specs.network_policy import (
    DEFAULT_MONITORING_NAMESPACE,
    DEFAULT_OPERATOR_NAMESPACE,
    OperatorPeer,
    host_cidrs,
)

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
        self.operator_namespace = operator_namespace()
        self.monitoring_namespace = monitoring_namespace  # whose pods may scrape by default
        # Outside the cluster the operator connects from a node's host network (a pod selector cannot
        # name it): the policy then also admits the addresses of the nodes the instances run on.
        self.in_cluster = runs_in_cluster() if in_cluster is None else in_cluster

    async def follow_up(self, ctx: ReconcileContext) -> int:
        """Pods that carry the cluster's labels but are none of its instances (a tenant's look-alikes) are
        ignored everywhere; one Warning names them, again only when the set changes."""
        key = (ctx.namespace, ctx.name)
        foreign = sorted(ctx.snapshot.foreign_pods)
        if not foreign:
            self._foreign_warned.forget(key)
            return 0
        message = "; ".join(foreign_pod_message(name, ctx.name) for name in foreign)
        return await self._foreign_warned.warn(ctx.body, "ForeignPod", message)

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
        desired = desired_children(
            cluster, existing_statefulset=ctx.statefulset, operator=operator, nodes=ctx.snapshot.nodes
        )
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
