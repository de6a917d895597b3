"""The cluster's `.status`, computed from what the controller observed. Equal input gives an equal dict,
and a condition's lastTransitionTime only moves when its status does, so the controller can write the
status only when it differs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA
from pg_operator.orchestration.instances import (
    ROLES,
    patroni_state,
    pending_restart_settings,
    pod_ready,
    pod_role,
)
from pg_operator.specs.backup_status import carried_conditions, carried_fields
from pg_operator.specs.labels import selector_labels

PHASE_CREATING = "Creating"
PHASE_HEALTHY = "Healthy"
PHASE_UPDATING = "Updating"

# Degraded's reason while an object the cluster would write exists at one of its names without being the
# cluster's (no controller reference with its uid): the object is left alone (specs/ownership.py).
CONFLICT_REASON = "Conflict"

# The label the endpointslice controller puts on each slice of a Service, naming the Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _timestamp(now: datetime) -> str:
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# status.instances[].lagBytes is rounded down to whole MiB: exact byte counts move with every WAL write
# and would rewrite the status on every Patroni loop. The exact figure is an operator metric.
LAG_REPORT_GRANULARITY = 1024 * 1024


def _patroni_timeline(meta: Mapping[str, Any]) -> int | None:
    """The timeline changes only on promotion, so reporting it costs no extra status writes."""
    timeline = patroni_state(meta).get("timeline")
    return timeline if isinstance(timeline, int) and not isinstance(timeline, bool) else None


def _wal_position(meta: Mapping[str, Any]) -> int | None:
    position = patroni_state(meta).get("xlog_location")
    return position if isinstance(position, int) and not isinstance(position, bool) else None


def replication_lag(cluster_name: str, pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Bytes each replica is behind the primary, from the WAL positions Patroni published on the pods
    (the same data Patroni's /cluster computes its lag from; no request). Only replicas whose position
    and whose primary's position are both known; a replica ahead of a stale sample counts 0."""
    live = [p for p in pods if objects.label(p, CLUSTER_LABEL) == cluster_name and not objects.deleting(p)]
    primaries = [p for p in live if pod_role(p) == ROLE_PRIMARY]
    if len(primaries) != 1:
        return {}  # none, or two during a failover: no single reference to measure against
    head = _wal_position(objects.meta(primaries[0]))
    if head is None:
        return {}
    lag: dict[str, int] = {}
    for pod in live:
        if pod_role(pod) != ROLE_REPLICA:
            continue
        position = _wal_position(objects.meta(pod))
        if position is not None:
            lag[objects.name(pod)] = max(0, head - position)
    return lag


def _instances(cluster: PostgresCluster, pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    lag = replication_lag(cluster.name, pods)
    instances = []
    for pod in pods:
        meta = objects.meta(pod)
        # Terminating pods are on their way out and no longer count, whatever their labels still say.
        if objects.label(pod, CLUSTER_LABEL) != cluster.name or objects.deleting(pod):
            continue
        role = objects.label(pod, ROLE_LABEL)
        instance = {
            "name": objects.name(pod),
            "role": ROLES.get(role, role) if role else "unknown",
            "ready": pod_ready(pod),
            "_revision": objects.labels(pod).get("controller-revision-hash"),
        }
        timeline = _patroni_timeline(meta)
        if timeline is not None:
            instance["timeline"] = timeline
        if instance["name"] in lag:
            instance["lagBytes"] = lag[instance["name"]] // LAG_REPORT_GRANULARITY * LAG_REPORT_GRANULARITY
        waiting = pending_restart_settings(meta)
        if waiting is not None:
            instance["pendingRestart"] = list(waiting)
        instances.append(instance)
    return sorted(instances, key=lambda i: i["name"])


def _current_primary(instances: list[dict[str, Any]]) -> str:
    primaries = [i for i in instances if i["role"] == ROLE_PRIMARY]
    # Prefer a ready primary; during a failover two pods may briefly carry the label.
    primaries.sort(key=lambda i: (not i["ready"], i["name"]))
    return str(primaries[0]["name"]) if primaries else ""


def rw_service_name(cluster_name: str) -> str:
    """The `-rw` Service (specs/names.rw_service), from the name alone: slices are matched by it."""
    return f"{cluster_name}-rw"


def routes_to(endpoint_slices: Sequence[Mapping[str, Any]], service: str, pod: str) -> bool:
    """Whether one of `service`'s EndpointSlices lists `pod` as a ready endpoint with an address: what
    kube-proxy routes the Service's ClusterIP to. A missing `ready` means unknown, which the API asks
    consumers to treat as ready."""
    if not pod:
        return False
    for slice_ in endpoint_slices:
        if objects.label(slice_, SERVICE_NAME_LABEL) != service or objects.deleting(slice_):
            continue
        for endpoint in slice_.get("endpoints") or ():
            target = endpoint.get("targetRef") or {}
            if target.get("kind") != "Pod" or target.get("name") != pod or not endpoint.get("addresses"):
                continue
            if (endpoint.get("conditions") or {}).get("ready", True) is not False:
                return True
    return False


def _was_creating(previous: Mapping[str, Any] | None) -> bool:
    """The previous reconcile reported the cluster as still being created. Read from Progressing as well as
    the phase: a failed reconcile's report (controller/failure_report.py) replaces the phase, not
    Progressing."""
    if str((previous or {}).get("phase") or "") in ("", PHASE_CREATING):
        return True
    progressing = objects.condition(previous, "Progressing")
    return not progressing or progressing.get("reason") == "Creating"


def _condition(
    cluster: PostgresCluster,
    previous: Mapping[str, Any] | None,
    now: str,
    type_: str,
    status: bool,
    reason: str,
    message: str,
) -> dict[str, Any]:
    value = "True" if status else "False"
    since = now
    for old in (previous or {}).get("conditions") or []:
        if old.get("type") == type_ and old.get("status") == value and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": cluster.generation,
        "lastTransitionTime": since,
    }


def compute_status(  # noqa: C901, PLR0912, PLR0915 - gaining the stuck-pod reasons; split after
    cluster: PostgresCluster,
    *,
    previous: Mapping[str, Any] | None,
    statefulset: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: datetime,
    problem: tuple[str, str] | None = None,
    endpoint_slices: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The full `.status`. `problem=(reason, message)` is a permanent problem the controller found (e.g. a
    missing StorageClass): it makes the cluster Degraded until it is gone. `endpoint_slices`: the
    cluster's EndpointSlices as observed (the `-rw` Service's are the ones read): Ready needs the
    `-rw` Service to route to the primary, so a client connecting right after Ready is not refused."""
    stamp = _timestamp(now)
    instances = _instances(cluster, pods)
    desired = cluster.spec.replicas
    existing = len(instances)
    ready = sum(1 for i in instances if i["ready"])
    primary = _current_primary(instances)
    primary_ready = any(i["name"] == primary and i["ready"] for i in instances)
    instances_ready = primary_ready and ready == desired and existing == desired
    rw = rw_service_name(cluster.name)
    routed = primary_ready and routes_to(endpoint_slices, rw, primary)
    all_ready = instances_ready and routed

    sts_spec = (statefulset or {}).get("spec") or {}
    sts_status = (statefulset or {}).get("status") or {}
    update_revision = sts_status.get("updateRevision")
    outdated = [i for i in instances if update_revision and i["_revision"] not in (None, update_revision)]

    creating = statefulset is None or (_was_creating(previous) and not all_ready)
    scaling = not creating and (existing != desired or sts_spec.get("replicas", desired) != desired)
    updating = not creating and bool(outdated)

    # Progressing: the operator is still moving reality towards the spec.
    if creating and instances_ready:
        progressing = (True, "Creating", f"{ready} of {desired} instances ready; {rw} not routed yet")
    elif creating:
        progressing = (True, "Creating", f"{ready} of {desired} instances ready")
    elif scaling:
        progressing = (True, "Scaling", f"{existing} → {desired} instances")
    elif updating:
        progressing = (
            True,
            "Updating",
            f"{len(outdated)} of {existing} instances run an outdated pod template",
        )
    else:
        progressing = (False, "Reconciled", "the cluster matches its spec")

    # Degraded: something is wrong that waiting for the current change will not fix.
    if problem is not None:
        degraded = (True, problem[0], problem[1])
    elif not creating and not primary_ready:
        degraded = (True, "NoPrimary", "no ready instance holds the primary role")
    elif not creating and not routed:
        # Writes through -rw are refused until it does: after a failover, for the moment the
        # endpointslice controller takes; for good if something keeps the slice from listing it.
        degraded = (True, "PrimaryNotRouted", f"the {rw} Service does not route to {primary} yet")
    elif not creating and not scaling and not updating and not all_ready:
        degraded = (True, "InstancesNotReady", f"{ready} of {desired} instances ready")
    else:
        degraded = (False, "AsExpected", "")

    if all_ready:
        ready_cond = (True, "AllInstancesReady", f"{ready} of {desired} instances ready; primary {primary}")
    elif not primary_ready:
        ready_cond = (False, "NoPrimary", f"{ready} of {desired} instances ready; no ready primary")
    elif not instances_ready:
        ready_cond = (False, "InstancesNotReady", f"{ready} of {desired} instances ready")
    else:
        ready_cond = (False, "PrimaryNotRouted", f"the {rw} Service does not route to {primary} yet")

    if problem is not None:
        phase = f"Degraded: {problem[0]}"
    elif creating:
        phase = PHASE_CREATING
    elif degraded[0] and degraded[1] in ("NoPrimary", "PrimaryNotRouted"):
        phase = f"Degraded: {degraded[1]}"
    elif scaling:
        phase = f"Scaling {existing} → {desired}"
    elif updating:
        phase = PHASE_UPDATING
    elif all_ready:
        phase = PHASE_HEALTHY
    else:
        phase = f"Degraded: {degraded[1]}"

    return {
        "phase": phase,
        "conditions": [
            _condition(cluster, previous, stamp, "Ready", *ready_cond),
            _condition(cluster, previous, stamp, "Progressing", *progressing),
            _condition(cluster, previous, stamp, "Degraded", *degraded),
            # Written by the backup controller; kept as they were (specs/backup_status.py).
            *carried_conditions(previous),
        ],
        "observedGeneration": cluster.generation,
        "replicas": existing,
        "readyReplicas": ready,
        "currentPrimary": primary,
        # Keys are left out rather than null: a null would be dropped by the merge patch and make every
        # later reconcile see a difference.
        "instances": [
            {k: i[k] for k in ("name", "role", "ready", "timeline", "lagBytes", "pendingRestart") if k in i}
            for i in instances
        ],
        "selector": ",".join(f"{k}={v}" for k, v in sorted(selector_labels(cluster).items())),
        **carried_fields(previous),
    }
