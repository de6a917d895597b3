"""Instances on lost nodes: which they are, and whether one may be replaced on another node now.

A node that stopped reporting (powered off, cut off, crashed) leaves its pods bound to it: `Running` or,
once evicted, `Terminating` forever, since only its silent kubelet could confirm their end. The
StatefulSet controller never replaces such a pod by itself (two pods of one name could then run at
once), and a node-local volume could not follow it anyway. Patroni has already moved the primary if the
lost one was it (its leader key expired); what is left is a member short.

Replacing it means force-deleting the pod (grace 0) and deleting its claim, so the StatefulSet recreates
both on another node, the new volume empty, and Patroni clones the member from the primary. It is done
only when it is safe:

- the user allows it (`spec.nodeLoss.replaceInstances`), or left it unset and the volume is pinned to the
  lost node (node-local storage: waiting for the node is then the only other way back);
- the node has been lost for `spec.nodeLoss.after` (a node that returns sooner costs nothing);
- the lost instance is not Patroni's leader, and the leader key is held by another instance, renewed
  within its ttl: the primary lives elsewhere, so the lost one cannot be the only copy of any
  acknowledged write (with synchronous replication a recorded standby confirmed each commit);
- every other instance is ready and the StatefulSet is at its size: never two replacements at once, and
  never while a replacement is still cloning.

The pod being gone from the API, its kubelet kills its containers when the node returns; a lost primary
was demoted by Patroni when it could no longer renew its key, and its old volume stays with its
provisioner (a PersistentVolume belongs to who created it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from pg_operator import objects
from pg_operator.api.node_loss import NodeLoss
from pg_operator.orchestration.nodes import NodeHealth, Readiness

HOSTNAME_LABEL = "kubernetes.io/hostname"


def describe(readiness: Readiness) -> str:
    return {
        Readiness.NOT_READY: "NotReady",
        Readiness.UNKNOWN: "Unknown (no heartbeat)",
        Readiness.GONE: "gone (the Node was deleted)",
        Readiness.READY: "Ready",
    }[readiness]


@dataclass(frozen=True)
class LostInstance:
    pod: str
    uid: str
    node: str
    readiness: Readiness
    since: datetime | None
    terminating: bool  # deleted (evicted) but never confirmed gone by its kubelet

    def message(self) -> str:
        since = f" since {self.since.strftime('%Y-%m-%dT%H:%M:%SZ')}" if self.since is not None else ""
        stuck = ", its pod stuck Terminating" if self.terminating else ""
        state = describe(self.readiness)
        return f"instance {self.pod} is on node {self.node}, which is {state}{since}{stuck}"


def lost_instances(pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, NodeHealth]) -> list[LostInstance]:
    """The instances whose pod is bound to a node that is not Ready or gone, by pod name (a node absent
    from `nodes` is not judged)."""
    out = []
    for pod in pods:
        health = nodes.get(str(objects.spec(pod).get("nodeName") or ""))
        if health is None or not health.lost:
            continue
        out.append(LostInstance(objects.name(pod), objects.uid(pod), health.name, health.readiness,
                                health.since, objects.deleting(pod)))  # fmt: skip
    return sorted(out, key=lambda lost: lost.pod)


def problem_message(lost: Sequence[LostInstance]) -> str:
    return "; ".join(i.message() for i in lost)


def pinned_to(volume: Mapping[str, Any] | None, node: str) -> bool | None:
    """Whether a PersistentVolume can be used on `node` only (its required node affinity names that one
    hostname and no other), as node-local volumes are; None when the volume is unknown."""
    if volume is None:
        return None
    terms = (((objects.spec(volume).get("nodeAffinity") or {}).get("required") or {})
             .get("nodeSelectorTerms") or [])  # fmt: skip
    if not terms:
        return False
    for term in terms:
        hosts: set[str] | None = None
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == HOSTNAME_LABEL and expression.get("operator") == "In":
                hosts = set(expression.get("values") or [])
        if hosts is None or hosts - {node}:
            return False  # this term admits another node
    return True


@dataclass(frozen=True)
class LeaderKey:
    """Patroni's leader key (the `<scope>-leader` ConfigMap's annotations)."""

    holder: str
    renewed: datetime | None
    ttl: float

    def fresh(self, now: datetime) -> bool:
        if not self.holder or self.renewed is None:
            return False
        return (now - self.renewed).total_seconds() <= self.ttl


def leader_key(configmap: Mapping[str, Any] | None, default_ttl: float) -> LeaderKey | None:
    holder = objects.annotation(configmap, "leader")
    if not holder:
        return None
    renewed_text = objects.annotation(configmap, "renewTime")
    try:
        renewed = datetime.fromisoformat(renewed_text.replace("Z", "+00:00")) if renewed_text else None
    except ValueError:
        renewed = None
    ttl_text = objects.annotation(configmap, "ttl")
    ttl = float(ttl_text) if ttl_text.replace(".", "", 1).isdigit() else default_ttl
    return LeaderKey(holder, renewed, ttl)


class Verdict(Enum):
    OFF = "off"  # the policy does not replace this instance
    WAIT = "wait"  # allowed, once the delay is over
    HOLD = "hold"  # allowed and due, but not safe now
    REPLACE = "replace"


@dataclass(frozen=True)
class Replacement:
    verdict: Verdict
    instance: LostInstance
    reason: str
    wait_seconds: float = 0.0


def replacing_allowed(policy: NodeLoss, pinned: bool | None) -> tuple[bool, str]:
    if policy.replace_instances is not None:
        setting = str(policy.replace_instances).lower()
        return policy.replace_instances, f"spec.nodeLoss.replaceInstances is {setting}"
    if pinned:
        return True, "its volume is pinned to the lost node"
    if pinned is None:
        return False, "its volume could not be read (spec.nodeLoss.replaceInstances unset)"
    return False, "its volume can follow it to another node (spec.nodeLoss.replaceInstances unset)"


def plan_replacement(
    lost: LostInstance,
    *,
    policy: NodeLoss,
    pinned: bool | None,
    leader: LeaderKey | None,
    ready: Mapping[str, bool],
    replicas: int,
    lost_names: frozenset[str],
    now: datetime,
) -> Replacement:
    """What to do with one lost instance now. `ready`: every instance pod of the StatefulSet there is, by
    name, whether ready; `replicas`: the StatefulSet's size; `lost_names`: every lost instance."""
    allowed, why = replacing_allowed(policy, pinned)
    if not allowed:
        return Replacement(Verdict.OFF, lost, f"not replaced: {why}")
    since = lost.since or now
    remaining = policy.after_seconds - (now - since).total_seconds()
    if remaining > 0:
        return Replacement(Verdict.WAIT, lost, f"replaced in {int(remaining) + 1}s ({why})", remaining)
    if leader is None or not leader.fresh(now):
        return Replacement(Verdict.HOLD, lost, "not replaced yet: no instance holds a fresh leader key")
    if leader.holder == lost.pod:
        return Replacement(Verdict.HOLD, lost, "not replaced: it still holds the leader key")
    if leader.holder in lost_names or not ready.get(leader.holder, False):
        return Replacement(Verdict.HOLD, lost, f"not replaced yet: the leader {leader.holder} is not ready")
    others = [name for name in ready if name not in lost_names]
    if len(ready) < replicas or not all(ready[name] for name in others):
        busy = "not replaced yet: another instance is not ready (one replacement at a time)"
        return Replacement(Verdict.HOLD, lost, busy)
    return Replacement(Verdict.REPLACE, lost, why)
