"""Where the instances and pooler pods may run (pure): pod anti-affinity over a node label, spread over
zones, and the node counts placement is reported with.

`spec.affinity.podAntiAffinity: auto` (the default) is decided once, when the StatefulSet is created:
'required' when at least spec.replicas schedulable nodes admit the instances (nodeSelector, tolerations),
else 'preferred' (a one-node cluster runs three instances side by side). Afterwards the live StatefulSet's
pod template says which it is, and that is kept: were it decided again from the nodes seen on every pass, a
node lost or drained would turn 'required' into 'preferred' and back, a new StatefulSet revision each time,
and an instance recreated meanwhile (the drained node's, a lost one's replacement) would be placed by
another rule than its peers: beside one of them while the node is away, and left there after it returns.
The StatefulSet is OnDelete (the operator recreates pods for image changes only), so a changed placement
applies to each pod when it is next recreated. The operator that may not read Nodes (a namespaced
install) decides 'preferred'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.placement import ANTI_AFFINITY_AUTO
from pg_operator.orchestration.nodes import NodeView, TolerationView, matching, schedulable

AntiAffinity = Literal["required", "preferred", "none"]
REQUIRED_KEY = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED_KEY = "preferredDuringSchedulingIgnoredDuringExecution"


def tolerations(cluster: PostgresCluster) -> list[TolerationView]:
    return [TolerationView(t.key, t.operator, t.value, t.effect) for t in cluster.spec.tolerations]


def admitting_nodes(cluster: PostgresCluster, nodes: Sequence[NodeView]) -> list[NodeView]:
    """The nodes the instances may run on (cordoned ones included: they come back)."""
    return matching(
        nodes, cluster.spec.node_selector, tolerations(cluster), cluster.spec.affinity.node_affinity
    )


def live_anti_affinity(statefulset: Mapping[str, Any] | None) -> AntiAffinity | None:
    """Which anti-affinity the live StatefulSet's pods have (None: no StatefulSet)."""
    if statefulset is None:
        return None
    template = objects.spec(statefulset).get("template") or {}
    anti = ((template.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
    if anti.get(REQUIRED_KEY):
        return "required"
    if anti.get(PREFERRED_KEY):
        return "preferred"
    return "none"


def anti_affinity(
    cluster: PostgresCluster, existing: Mapping[str, Any] | None, nodes: Sequence[NodeView] | None
) -> AntiAffinity:
    """The anti-affinity the instances get (module docstring). `nodes`: every Node the operator sees,
    None when it may not read them."""
    mode = cluster.spec.affinity.pod_anti_affinity
    if mode != ANTI_AFFINITY_AUTO:
        return mode
    live = live_anti_affinity(existing)
    if live is not None:
        return "preferred" if live == "none" else live
    if nodes is None:
        return "preferred"
    room = schedulable(admitting_nodes(cluster, nodes))
    return "required" if len(room) >= cluster.spec.replicas else "preferred"


def anti_affinity_term(
    mode: AntiAffinity, topology_key: str, match_labels: Mapping[str, str]
) -> dict[str, Any] | None:
    if mode == "none":
        return None
    term = {"labelSelector": {"matchLabels": dict(match_labels)}, "topologyKey": topology_key}
    if mode == "required":
        return {"podAntiAffinity": {REQUIRED_KEY: [term]}}
    return {"podAntiAffinity": {PREFERRED_KEY: [{"weight": 100, "podAffinityTerm": term}]}}


def pod_affinity(cluster: PostgresCluster, anti: AntiAffinity, match_labels: Mapping[str, str],
                 topology_key: str) -> dict[str, Any] | None:  # fmt: skip
    """A pod's `affinity`: the anti-affinity, and spec.affinity.nodeAffinity as one node selector term
    (every expression must hold)."""
    out = anti_affinity_term(anti, topology_key, match_labels) or {}
    expressions = [
        r.model_dump(by_alias=True, exclude_none=True, mode="json")
        for r in cluster.spec.affinity.node_affinity
    ]
    if expressions:
        out["nodeAffinity"] = {REQUIRED_KEY: {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}
    return out or None


def zone_spread(
    mode: Literal["preferred", "required", "none"], zone_key: str, match_labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """topologySpreadConstraints: at most one more pod in a zone than in any other. Tainted nodes the pods
    do not tolerate are no zone of theirs (nodeTaintsPolicy Honor), so a zone of such nodes alone does not
    hold the others back."""
    if mode == "none":
        return []
    return [
        {
            "maxSkew": 1,
            "topologyKey": zone_key,
            "whenUnsatisfiable": "DoNotSchedule" if mode == "required" else "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(match_labels)},
            "nodeAffinityPolicy": "Honor",
            "nodeTaintsPolicy": "Honor",
        }
    ]


def too_few_nodes(cluster: PostgresCluster, statefulset: Mapping[str, Any] | None,
                  nodes: Sequence[NodeView] | None) -> str | None:  # fmt: skip
    """Why some instance cannot be scheduled for want of nodes, naming how many match; None when the
    nodes suffice (or are not known). Only 'required' anti-affinity makes this so: 'preferred' lets
    instances share a node."""
    if nodes is None or live_anti_affinity(statefulset) != "required":
        return None
    key = cluster.spec.affinity.topology_key
    admitted = admitting_nodes(cluster, nodes)
    domains = {n.label(key) for n in admitted if n.label(key) is not None}
    want = cluster.spec.replicas
    if len(domains) >= want:
        return None
    what = "node(s)" if key == "kubernetes.io/hostname" else f"value(s) of node label {key}"
    return (
        f"spec.replicas is {want} but only {len(domains)} {what} admit the instances (of {len(nodes)} "
        f"node(s); nodeSelector and tolerations decide) and the pod anti-affinity over {key} is required: "
        f"{want - len(domains)} instance(s) cannot be scheduled. Add nodes, or set "
        "spec.affinity.podAntiAffinity: preferred to let instances share a node"
    )


# The node lifecycle controller's taints on a node that stopped reporting (unreachable) or reports it is not
# ready, and how long a pooler pod stays bound to such a node.
LOST_NODE_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
LOST_NODE_STAY_SECONDS = 30


def pooler_tolerations(cluster: PostgresCluster) -> list[dict[str, Any]]:
    """The user's tolerations, then a short stay on a lost node: a pooler pod holds nothing, so 30 s after
    its node went NotReady or Unknown it is evicted and its Deployment starts another on a live node (the
    API server's default is 300 s). A toleration of the user's for the same key wins. (The instances keep
    the default: the StatefulSet would not replace an evicted one anyway; reconcilers/node_loss.py does.)"""
    out = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in cluster.spec.tolerations]
    tolerated = {t.get("key") for t in out}
    out += [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": LOST_NODE_STAY_SECONDS}
        for key in LOST_NODE_TAINTS
        if key not in tolerated
    ]
    return out
