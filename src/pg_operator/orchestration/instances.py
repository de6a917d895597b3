"""What the operator knows about each instance: its pod as the kubelet reports it, plus Patroni's view."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA
from pg_operator.orchestration.stuck_pods import container_stuck, unscheduled
from pg_operator.tls_files import LOADED_TAG

# Patroni's role labels (older versions say master) and what they mean here.
ROLES = {ROLE_PRIMARY: ROLE_PRIMARY, "master": ROLE_PRIMARY, ROLE_REPLICA: ROLE_REPLICA}

POSTGRES_CONTAINER = "postgres"


@dataclass(frozen=True)
class Member:
    """One entry of Patroni's GET /cluster."""

    name: str
    role: str  # "leader", "standby_leader", "replica", "sync_standby", "quorum_standby"
    state: str  # "running", "streaming", "starting", "stopped", ...
    timeline: int | None
    lag_bytes: int | None  # None when Patroni reports it as unknown

    @property
    def is_leader(self) -> bool:
        return self.role in ("leader", "standby_leader")

    @property
    def is_sync(self) -> bool:
        """A synchronous standby: with synchronous replication Patroni switches over only to one."""
        return self.role in ("sync_standby", "quorum_standby")

    @property
    def streaming(self) -> bool:
        return not self.is_leader and self.state == "streaming"


@dataclass(frozen=True)
class Instance:
    name: str
    ordinal: int
    image: str | None
    role: str  # ROLE_PRIMARY, ROLE_REPLICA or "" when Patroni has not labelled the pod yet
    ready: bool
    terminating: bool
    created: datetime | None
    # The kubelet's word that the database container is not running right now (terminated, or
    # waiting to be restarted after it exited): certain evidence, unlike a missed heartbeat.
    container_down: bool
    pod_ip: str = ""
    member: Member | None = None
    # Patroni's word (in the pod's `status` annotation) that a changed setting waits for a restart, and
    # which settings; no request needed to see it.
    pending_restart: tuple[str, ...] | None = None
    # Patroni's state of the member from the same annotation ("running", "streaming", "starting",
    # "start failed", "restart failed", "crashed", ...), "" when not published.
    state: str = ""
    # Since when the pod is not ready (its Ready condition's last transition), None while ready.
    not_ready_since: datetime | None = None
    # The timeline Patroni publishes the member on (None while its PostgreSQL is not running), and, for
    # a leader, whether the checkpoint after its promotion is still to be published: until then no
    # other member can pg_rewind from it.
    timeline: int | None = None
    checkpoint_pending: bool = False
    # Patroni says the member's WAL receiver streams from its upstream (`replication_state`).
    streaming: bool = False
    # The kubelet or the scheduler says the pod cannot run (orchestration/stuck_pods.py): an image that
    # cannot be pulled, a crash loop, a container that cannot be created, no node for it.
    cannot_start: bool = False

    @property
    def healthy_replica(self) -> bool:
        return (
            self.role == ROLE_REPLICA
            and self.ready
            and not self.terminating
            and (self.member is None or self.member.streaming)
        )

    @property
    def viable_replica(self) -> bool:
        """Could take over from a dead primary: its database runs, whatever its lag or readiness (a
        replica of a dead primary stops streaming and may fail its readiness check)."""
        return (
            self.role == ROLE_REPLICA
            and not self.terminating
            and not self.container_down
            and (self.member is None or self.member.state in ("running", "streaming"))
        )

    @property
    def lag(self) -> int:
        """Replication lag for ranking; unknown counts as worst."""
        if self.member is None or self.member.lag_bytes is None:
            return 2**62
        return self.member.lag_bytes


def parse_members(cluster_json: Mapping[str, Any]) -> dict[str, Member]:
    """Patroni's GET /cluster body → members by name. Patroni reports lag as a number of bytes or as
    the string "unknown"."""
    members: dict[str, Member] = {}
    for raw in cluster_json.get("members") or []:
        lag = raw.get("lag")
        timeline = raw.get("timeline")
        members[str(raw.get("name"))] = Member(
            name=str(raw.get("name")),
            role=str(raw.get("role", "")),
            state=str(raw.get("state", "")),
            timeline=int(timeline) if isinstance(timeline, int) else None,
            lag_bytes=int(lag) if isinstance(lag, int) else (0 if raw.get("role") == "leader" else None),
        )
    return members


def _ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _container(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    items = (pod.get("spec") if kind == "spec" else pod.get("status") or {}) or {}
    key = "containers" if kind == "spec" else "containerStatuses"
    for c in items.get(key) or []:
        if c.get("name") == POSTGRES_CONTAINER:
            return dict(c)
    return {}


def loaded_tls(meta: Mapping[str, Any]) -> str:
    """The digest of the TLS files the instance says it runs with (tls_files.LOADED_TAG), "" if none."""
    tags = patroni_state(meta).get("tags")
    return str(tags.get(LOADED_TAG) or "") if isinstance(tags, Mapping) else ""


def patroni_state(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The member data Patroni publishes as JSON in the pod's `status` annotation (role, state,
    timeline, xlog_location: the WAL position it wrote, or received/replayed as a replica,
    pending_restart ...), from the pod's metadata; empty when absent or not a JSON object."""
    try:
        state = json.loads(str((meta.get("annotations") or {}).get("status") or "{}"))
    except (TypeError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return objects.condition_status(objects.status(pod), "Ready") == "True"


def pod_role(pod: Mapping[str, Any]) -> str:
    """primary or replica as Patroni labels the pod (older Patroni says master), else ""."""
    return ROLES.get(objects.label(pod, ROLE_LABEL), "")


def pending_restart_settings(meta: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The settings waiting for a restart of this member (`pending_restart`, `pending_restart_reason`
    in Patroni's member data); None when nothing waits."""
    return _pending_restart(patroni_state(meta))


def _pending_restart(state: Mapping[str, Any]) -> tuple[str, ...] | None:
    if state.get("pending_restart") is not True:
        return None
    reason = state.get("pending_restart_reason")
    return tuple(sorted(str(k) for k in reason)) if isinstance(reason, dict) else ()


def instance_from_pod(pod: Mapping[str, Any], members: Mapping[str, Member] | None = None) -> Instance:
    meta = objects.meta(pod)
    published = patroni_state(meta)  # parsed once: every reconcile reads every pod
    name = objects.name(pod)
    role = pod_role(pod)
    status = _container(pod, "status")
    state = status.get("state") or {}
    down = bool(status) and (
        "terminated" in state or ("waiting" in state and int(status.get("restartCount") or 0) > 0)
    )
    return Instance(
        name=name,
        ordinal=_ordinal(name),
        image=_container(pod, "spec").get("image"),
        role=role,
        ready=pod_ready(pod),
        terminating=bool(meta.get("deletionTimestamp")),
        created=_parse_time(meta.get("creationTimestamp")),
        container_down=down,
        pod_ip=str(objects.status(pod).get("podIP") or ""),
        member=(members or {}).get(name),
        pending_restart=_pending_restart(published),
        state=str(published.get("state") or ""),
        not_ready_since=None
        if pod_ready(pod)
        else _parse_time((objects.condition(objects.status(pod), "Ready") or {}).get("lastTransitionTime")),
        timeline=_timeline(published),
        checkpoint_pending=published.get("checkpoint_after_promote") is False,
        streaming=published.get("replication_state") == "streaming",
        cannot_start=container_stuck(pod) is not None or unscheduled(pod) is not None,
    )


def _timeline(published: Mapping[str, Any]) -> int | None:
    value = published.get("timeline")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def instances_from_pods(
    pods: Sequence[Mapping[str, Any]], members: Mapping[str, Member] | None = None
) -> list[Instance]:
    return sorted((instance_from_pod(p, members) for p in pods), key=lambda i: i.ordinal)
