"""The cluster's NetworkPolicy: who may reach its instances, port by port (docs/network.md).

- PostgreSQL (5432): the peers of `spec.networkPolicy.allowFrom` (unset: every pod of the cluster's
  namespace), the cluster's own pods (replication, pg_rewind) and the operator.
- Patroni's REST API (8008): only the cluster's own pods (Patroni asks its peers during failover) and the
  operator (switchovers, restarts, dynamic configuration).
- The instances' metrics port (9187): `spec.networkPolicy.metricsFrom` (unset: the pods of the monitoring
  namespace the install names, the operator's `--monitoring-namespace`, plus the cluster's own pods and the
  operator; with no monitoring namespace named, only those two). Never every namespace by default: the
  figures name databases and their sizes.

Ingress only: egress stays open (WAL archiving and restores reach an object store, Patroni the API server).
A node's own traffic to its pods (kubelet probes) is admitted by every NetworkPolicy implementation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import METRICS_PORT, PATRONI_PORT, PG_PORT
from pg_operator.api.network_policy import NetworkPeer
from pg_operator.api.pooler import any_pooler_pod
from pg_operator.specs.labels import COMPONENT_INSTANCE, child_metadata, selector_labels

DEFAULT_OPERATOR_NAMESPACE = "pg-operator-system"  # deploy/operator/namespace.yaml
# Where the install's Prometheus runs (the operator's --monitoring-namespace; deploy/ and the chart set it).
DEFAULT_MONITORING_NAMESPACE = "monitoring"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# The operator's pod labels (deploy/operator/deployment.yaml).
OPERATOR_POD_LABELS: dict[str, str] = {
    "app.kubernetes.io/name": "pg-operator",
    "app.kubernetes.io/component": "operator",
}


@dataclass(frozen=True)
class OperatorPeer:
    """The install's own peers: where the operator's connections come from (its pods in `namespace`, and
    when it runs outside the cluster on a node's host network, that node's addresses, `host_cidrs`), and
    the namespace the install names for monitoring, whose pods may scrape when `metricsFrom` is unset
    (empty: none)."""

    namespace: str
    host_cidrs: tuple[str, ...] = field(default=())
    monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE


DEFAULT_OPERATOR_PEER = OperatorPeer(DEFAULT_OPERATOR_NAMESPACE)  # deploy/ as shipped


def name(cluster: PostgresCluster) -> str:
    return cluster.name


def host_cidrs(host_ips: Iterable[str]) -> tuple[str, ...]:
    """Single-address CIDRs of the given host addresses, sorted and without repeats."""
    out = set()
    for ip in host_ips:
        if ip:
            out.add(f"{ip}/128" if ":" in ip else f"{ip}/32")
    return tuple(sorted(out))


def _peers(peers: list[NetworkPeer]) -> list[dict[str, Any]]:
    return [p.model_dump(by_alias=True, exclude_none=True, mode="json") for p in peers]


def operator_peers(operator: OperatorPeer) -> list[dict[str, Any]]:
    pods = {**_namespace(operator.namespace), "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    return [pods, *({"ipBlock": {"cidr": c}} for c in operator.host_cidrs)]


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def default_scrapers(operator: OperatorPeer, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Who may scrape when `metricsFrom` is unset: the pods of the install's monitoring namespace, and
    `own` (the operator and the workload's own pods); without a monitoring namespace, `own` only."""
    monitoring = [_namespace(operator.monitoring_namespace)] if operator.monitoring_namespace else []
    return [*monitoring, *own]


def _port(number: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": number}]


def network_policy(cluster: PostgresCluster, operator: OperatorPeer) -> dict[str, Any] | None:
    """The NetworkPolicy the cluster needs, or None when `spec.networkPolicy.enabled` is false."""
    spec = cluster.spec.network_policy
    if not spec.enabled:
        return None
    own_pods = {"podSelector": {"matchLabels": selector_labels(cluster)}}
    trusted = [own_pods, *operator_peers(operator)]
    clients = [{"podSelector": {}}] if spec.allow_from is None else _peers(spec.allow_from)
    if cluster.spec.pooler is not None and spec.allow_from is not None:
        # The pooler's pods (specs/pooler.py) reach PostgreSQL for the clients they admit.
        clients.append({"podSelector": {"matchLabels": any_pooler_pod(cluster.name)}})
    scrapers = default_scrapers(operator, trusted) if spec.metrics_from is None else _peers(spec.metrics_from)
    ingress = [
        {"from": [*trusted, *clients], "ports": _port(PG_PORT)},
        {"from": trusted, "ports": _port(PATRONI_PORT)},
    ]
    if scrapers:  # an empty `from` would admit everyone: metricsFrom [] means no rule at all
        ingress.append({"from": scrapers, "ports": _port(METRICS_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(cluster, name(cluster), COMPONENT_INSTANCE),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(cluster)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
