"""All children of a cluster except its Secrets, complete and in apply order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.orchestration.nodes import NodeView
from pg_operator.specs.configmap import configmap
from pg_operator.specs.network_policy import DEFAULT_OPERATOR_PEER, OperatorPeer, network_policy
from pg_operator.specs.pdb import pdbs
from pg_operator.specs.rbac import role, role_binding, service_account
from pg_operator.specs.services import services
from pg_operator.specs.statefulset import statefulset

# (apiVersion, kind) of what desired_children returns; owned children of these kinds that are not in
# its result are to be deleted (e.g. the PDB after scaling to one instance).
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
# Kinds only a sub-reconciler's own builders return (the pooler's Deployments, specs/pooler.py; the
# import Job, specs/import_job.py).
SUB_RECONCILER_KINDS: tuple[tuple[str, str], ...] = (("apps/v1", "Deployment"), ("batch/v1", "Job"))

# Everything the controller owns and watches. Secrets are owned too, but create-only and never pruned.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (*CHILD_KINDS, *SUB_RECONCILER_KINDS, ("v1", "Secret"))


def desired_children(
    cluster: PostgresCluster,
    *,
    existing_statefulset: Mapping[str, Any] | None = None,
    operator: OperatorPeer = DEFAULT_OPERATOR_PEER,
    nodes: Sequence[NodeView] | None = None,
    fenced: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """`operator`: where the operator's connections come from, for the NetworkPolicy. `nodes`: the Nodes
    the operator sees, None when it may not read them (no drain handling: specs/pdb.py; the `auto`
    anti-affinity: specs/placement.py); `fenced`: the instances told to stop PostgreSQL (instance.yaml)."""
    children = [
        service_account(cluster),
        role(cluster),
        role_binding(cluster),
        configmap(cluster, fenced),
        *services(cluster),
        statefulset(cluster, existing_statefulset, nodes),
        *pdbs(cluster, drains_handled=nodes is not None),
    ]
    policy = network_policy(cluster, operator)
    if policy is not None:
        children.append(policy)
    return children
