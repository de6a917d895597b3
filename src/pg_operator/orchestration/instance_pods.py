"""Which pods are a cluster's instances: the ones its own StatefulSet controls, never a look-alike.

A tenant owns its namespace and may create a pod carrying a cluster's labels (the cluster label,
`role=primary`). Taken for an instance it would get what only instances may: the operator's psql over pod
exec (role passwords' SCRAM verifiers on stdin), calls to "its Patroni" with the cluster's basic-auth
credentials, a place in the status as primary. Labels prove nothing; a pod is an instance only when its
controller reference is the StatefulSet the cluster controls (by uid), under a name that StatefulSet gives
its pods (`<statefulset>-<ordinal>`, an ordinal below the most replicas the API admits). A reference can
be forged, but not under a member's name while the member exists, and a forged pod under any other name is
no member the StatefulSet controller keeps either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster_sections import MAX_REPLICAS
from pg_operator.api.constants import GROUP, KIND

STATEFULSET_GROUP = "apps"
STATEFULSET_KIND = "StatefulSet"


def controller_reference(obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The object's controller ownerReference, if any (Kubernetes allows at most one)."""
    for ref in objects.owner_references(obj):
        if ref.get("controller") is True:
            return ref
    return None


def _group(ref: Mapping[str, Any]) -> str:
    api_version = str(ref.get("apiVersion") or "")
    return api_version.rpartition("/")[0]


def member_ordinal(pod_name: str, statefulset_name: str) -> int | None:
    """The ordinal of `pod_name` as a pod of the StatefulSet `statefulset_name` names it, or None when the
    StatefulSet would not name a pod so (another prefix, a non-decimal or zero-padded tail, an ordinal at
    or beyond the most replicas a cluster may have)."""
    prefix = f"{statefulset_name}-"
    if not pod_name.startswith(prefix):
        return None
    tail = pod_name[len(prefix) :]
    if not tail.isdigit() or not tail.isascii() or (len(tail) > 1 and tail.startswith("0")):
        return None
    ordinal = int(tail)
    return ordinal if ordinal < MAX_REPLICAS else None


def controlled_by_a_statefulset(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's controller is a StatefulSet (any: the cache's cheap first cut, before it knows
    which StatefulSet is the cluster's)."""
    ref = controller_reference(pod)
    return ref is not None and ref.get("kind") == STATEFULSET_KIND and _group(ref) == STATEFULSET_GROUP


def may_be_instance(pod: Mapping[str, Any], cluster_name: str) -> bool:
    """What the cache keeps of the pods carrying a cluster's label: controlled by a StatefulSet and named
    as the cluster's StatefulSet (named after the cluster) names its pods."""
    return controlled_by_a_statefulset(pod) and member_ordinal(objects.name(pod), cluster_name) is not None


def controls(statefulset: Mapping[str, Any] | None, cluster_uid: str) -> bool:
    """Whether the cluster with `cluster_uid` controls this StatefulSet."""
    ref = controller_reference(statefulset)
    return (ref is not None and bool(cluster_uid) and ref.get("uid") == cluster_uid
            and ref.get("kind") == KIND and _group(ref) == GROUP)  # fmt: skip


def is_member(pod: Mapping[str, Any], statefulset: Mapping[str, Any]) -> bool:
    """Whether the pod is one of this StatefulSet's: controlled by it (by uid) under a member's name."""
    ref = controller_reference(pod)
    return (ref is not None and ref.get("kind") == STATEFULSET_KIND and _group(ref) == STATEFULSET_GROUP
            and bool(objects.uid(statefulset)) and ref.get("uid") == objects.uid(statefulset)
            and member_ordinal(objects.name(pod), objects.name(statefulset)) is not None)  # fmt: skip


@dataclass(frozen=True)
class InstancePods:
    """The pods that are the cluster's instances, and the names of those that only look like them."""

    ours: tuple[dict[str, Any], ...]
    foreign: tuple[str, ...]


def instance_pods(
    pods: Sequence[dict[str, Any]], statefulset: Mapping[str, Any] | None, cluster_uid: str
) -> InstancePods:
    """Split the pods carrying the cluster's label: its instances are those of the StatefulSet the cluster
    controls. Without such a StatefulSet there is no instance, and nothing is called foreign either
    (the StatefulSet may not have reached the cache yet)."""
    if statefulset is None or not controls(statefulset, cluster_uid):
        return InstancePods((), ())
    ours, foreign = [], []
    for pod in pods:
        if is_member(pod, statefulset):
            ours.append(pod)
        else:
            foreign.append(objects.name(pod))
    return InstancePods(tuple(ours), tuple(sorted(foreign)))


def foreign_pod_message(pod_name: str, statefulset_name: str) -> str:
    """What a Warning says of a pod that carries the cluster's labels but is none of its instances."""
    return (f"pod {pod_name} carries the cluster's labels but is not controlled by its StatefulSet "
            f"{statefulset_name}: ignored (never an instance, primary, exec or Patroni target)")  # fmt: skip
