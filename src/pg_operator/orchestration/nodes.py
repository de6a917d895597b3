"""Nodes as the operator reads them (pure): the few fields of a Node that placement and drains depend on,
which nodes an instance may run on, and whether a node is being drained.

The operator keeps a `NodeView` per Node (controller/cache.py), not the Node object: a Node's status
changes every heartbeat and carries its image list; what is kept here changes only when a node is
cordoned, tainted, relabelled or changes readiness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from pg_operator.api.placement import NodeRequirement

# Taints that announce a node is being emptied: the one the node lifecycle controller adds to a cordoned
# node, the cluster autoscaler's and Karpenter's before they remove a node, and the one an administrator
# sets on a node that is shut down for good.
DRAIN_TAINT_KEYS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "ToBeDeletedByClusterAutoscaler",
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
        "node.kubernetes.io/out-of-service",
    }
)
# Effects that keep new pods off a node (NoExecute also evicts running ones that do not tolerate it).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class Readiness(Enum):
    READY = "Ready"
    NOT_READY = "NotReady"  # the kubelet reports it is not ready
    UNKNOWN = "Unknown"  # no heartbeat within the node-monitor grace period, or never reported
    GONE = "gone"  # the Node object was deleted


@dataclass(frozen=True)
class NodeHealth:
    """A node's readiness and since when (the Ready condition's last transition)."""

    name: str
    readiness: Readiness
    since: datetime | None

    @property
    def lost(self) -> bool:
        return self.readiness is not Readiness.READY


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeView:
    """What the operator reads of a Node."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    readiness: Readiness = Readiness.UNKNOWN  # the Ready condition (unset: Unknown, a node never reported)
    ready_since: datetime | None = None  # the Ready condition's last transition

    @property
    def ready(self) -> bool | None:
        """The Ready condition: True, False, or None when Unknown or unset."""
        return {Readiness.READY: True, Readiness.NOT_READY: False}.get(self.readiness)

    @property
    def lost(self) -> bool:
        return self.readiness is not Readiness.READY

    @property
    def health(self) -> NodeHealth:
        return NodeHealth(self.name, self.readiness, self.ready_since)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    @property
    def draining(self) -> bool:
        """Cordoned, or carrying a taint that announces it is being emptied."""
        return self.unschedulable or any(
            t.key in DRAIN_TAINT_KEYS and t.effect in BLOCKING_EFFECTS for t in self.taints
        )


def node_view(body: Mapping[str, object]) -> NodeView:
    """The NodeView of a Node object (a plain dict as the API returns it)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)
    labels = meta.get("labels") or {}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping)
    )
    readiness, since = Readiness.UNKNOWN, None
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            value = str(condition.get("status"))
            readiness = {"True": Readiness.READY, "False": Readiness.NOT_READY}.get(value, Readiness.UNKNOWN)
            since = parse_time(str(condition.get("lastTransitionTime") or ""))
    return NodeView(
        name=str(meta.get("name") or ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in dict(labels).items())),
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
        readiness=readiness,
        ready_since=since,
    )


@dataclass(frozen=True)
class TolerationView:
    """One toleration of the instances (api.placement.Toleration, as plain values)."""

    key: str | None
    operator: str  # Exists or Equal
    value: str | None
    effect: str | None

    def tolerates(self, taint: Taint) -> bool:
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is None:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or (self.value or "") == taint.value


def admits(
    node: NodeView,
    selector: Mapping[str, str],
    tolerations: Sequence[TolerationView] = (),
    expressions: Sequence[NodeRequirement] = (),
) -> bool:
    """Whether the instances' placement lets them run on `node`: every nodeSelector label matches, every
    node-affinity expression holds, and every taint that keeps pods off (NoSchedule, NoExecute) is
    tolerated, except the drain taints (a node being drained is still one of the cluster's nodes; it
    comes back on uncordon)."""
    if any(node.label(key) != value for key, value in selector.items()):
        return False
    labels = dict(node.labels)
    if not all(e.matches(labels) for e in expressions):
        return False
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS or taint.key in DRAIN_TAINT_KEYS:
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


def matching(
    nodes: Iterable[NodeView],
    selector: Mapping[str, str],
    tolerations: Sequence[TolerationView] = (),
    expressions: Sequence[NodeRequirement] = (),
) -> list[NodeView]:
    """The nodes the instances may run on (`admits`), cordoned ones included."""
    return [n for n in nodes if admits(n, selector, tolerations, expressions)]


def schedulable(nodes: Iterable[NodeView]) -> list[NodeView]:
    """Of `nodes`, those the scheduler places new pods on now: Ready and not being drained."""
    return [n for n in nodes if n.ready is True and not n.draining]
