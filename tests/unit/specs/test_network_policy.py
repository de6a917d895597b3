"""The cluster's NetworkPolicy, built from plain specs: who reaches 5432, 8008 and 9187, defaults (metrics
only from the install's monitoring namespace), the opt-out, and where the operator's connections come from
(its pods, or a node's host network)."""

from __future__ import annotations

from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.api.constants import METRICS_PORT
from pg_operator.pooler_contract import POOLER_METRICS_PORT
from pg_operator.specs import selector_labels
from pg_operator.specs.network_policy import (
    OPERATOR_POD_LABELS,
    OperatorPeer,
    host_cidrs,
    network_policy,
)
from pg_operator.specs.pooler import network_policy as pooler_network_policy

IN_CLUSTER = OperatorPeer("pg-operator-system")
OWN_PODS = {"podSelector": {"matchLabels": {
    "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "orders-db",
    "db.example.com/cluster": "orders-db"}}}  # fmt: skip
OPERATOR_PODS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pg-operator-system"}},
    "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "pg-operator", "app.kubernetes.io/component": "operator"}
    },
}


MONITORING_PODS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def rules_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["ingress"]:
        assert len(rule["ports"]) == 1 and rule["ports"][0]["protocol"] == "TCP"
        out[rule["ports"][0]["port"]] = rule["from"]
    return out


def test_default_policy_selects_the_instances_and_restricts_ingress_only() -> None:
    policy = network_policy(cluster(), IN_CLUSTER)
    assert policy is not None
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "orders-db" and policy["metadata"]["namespace"] == "shop"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["spec"]["podSelector"] == {"matchLabels": selector_labels(cluster())}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open (object store, API server)


def test_default_peers_per_port() -> None:
    ports = rules_by_port(network_policy(cluster(), IN_CLUSTER) or {})
    assert set(ports) == {5432, 8008, METRICS_PORT}
    # PostgreSQL: own pods, the operator, every pod of the cluster's namespace.
    assert ports[5432] == [OWN_PODS, OPERATOR_PODS, {"podSelector": {}}]
    # Patroni's REST API: own pods and the operator only.
    assert ports[8008] == [OWN_PODS, OPERATOR_PODS]
    # Metrics: the install's monitoring namespace, own pods and the operator; never every namespace.
    assert ports[METRICS_PORT] == [MONITORING_PODS, OWN_PODS, OPERATOR_PODS]
    assert all(peer.get("namespaceSelector") != {} for peer in ports[METRICS_PORT])


def test_the_monitoring_namespace_is_the_install_s() -> None:
    ports = rules_by_port(
        network_policy(cluster(), OperatorPeer("pg-operator-system", monitoring_namespace="observability"))
        or {}
    )
    assert ports[METRICS_PORT][0] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}
    }


def test_without_a_monitoring_namespace_only_own_pods_and_the_operator_scrape() -> None:
    ports = rules_by_port(
        network_policy(cluster(), OperatorPeer("pg-operator-system", monitoring_namespace="")) or {}
    )
    assert ports[METRICS_PORT] == [OWN_PODS, OPERATOR_PODS]


def test_own_pods_peer_is_the_statefulset_selector() -> None:
    assert OWN_PODS["podSelector"]["matchLabels"] == selector_labels(cluster())
    assert OPERATOR_PODS["podSelector"]["matchLabels"] == OPERATOR_POD_LABELS


def test_allow_from_replaces_the_namespace_default_and_is_copied_as_given() -> None:
    peers = [
        {"namespaceSelector": {"matchLabels": {"team": "shop"}}, "podSelector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["api", "worker"]}]}},
        {"ipBlock": {"cidr": "192.168.10.0/24", "except": ["192.168.10.128/25"]}},
    ]  # fmt: skip
    ports = rules_by_port(network_policy(cluster(networkPolicy={"allowFrom": peers}), IN_CLUSTER) or {})
    assert ports[5432] == [OWN_PODS, OPERATOR_PODS, *peers]
    assert ports[8008] == [OWN_PODS, OPERATOR_PODS]  # allowFrom never opens the REST API


def test_empty_allow_from_admits_only_own_pods_and_operator() -> None:
    ports = rules_by_port(network_policy(cluster(networkPolicy={"allowFrom": []}), IN_CLUSTER) or {})
    assert ports[5432] == [OWN_PODS, OPERATOR_PODS]


def test_metrics_from_replaces_the_default_and_empty_drops_the_rule() -> None:
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    policy = network_policy(cluster(networkPolicy={"metricsFrom": monitoring}), IN_CLUSTER)
    ports = rules_by_port(policy or {})
    assert ports[METRICS_PORT] == monitoring
    # An ingress rule with an empty `from` admits everyone: [] must mean no rule at all.
    ports = rules_by_port(network_policy(cluster(networkPolicy={"metricsFrom": []}), IN_CLUSTER) or {})
    assert METRICS_PORT not in ports
    for peers in ports.values():
        assert peers


def test_disabled_means_no_policy() -> None:
    assert network_policy(cluster(networkPolicy={"enabled": False}), IN_CLUSTER) is None
    assert network_policy(cluster(networkPolicy={"enabled": True}), IN_CLUSTER) is not None


def test_operator_namespace_follows_where_it_runs() -> None:
    ports = rules_by_port(network_policy(cluster(), OperatorPeer("db-operators")) or {})
    ns = ports[8008][1]["namespaceSelector"]["matchLabels"]
    assert ns == {"kubernetes.io/metadata.name": "db-operators"}


def test_out_of_cluster_operator_gets_the_node_addresses_on_every_port() -> None:
    peer = OperatorPeer("pg-operator-system", host_cidrs(["10.0.0.5", "10.0.0.4", "10.0.0.5", "", "fd00::1"]))
    assert peer.host_cidrs == ("10.0.0.4/32", "10.0.0.5/32", "fd00::1/128")
    ports = rules_by_port(network_policy(cluster(), peer) or {})
    hosts = [{"ipBlock": {"cidr": c}} for c in peer.host_cidrs]
    assert ports[8008] == [OWN_PODS, OPERATOR_PODS, *hosts]
    assert ports[5432][: 2 + len(hosts)] == [OWN_PODS, OPERATOR_PODS, *hosts]
    assert ports[METRICS_PORT] == [MONITORING_PODS, OWN_PODS, OPERATOR_PODS, *hosts]


def test_the_pooler_s_metrics_follow_the_same_default() -> None:
    c = cluster(pooler={})
    policy = pooler_network_policy(c, IN_CLUSTER)
    assert policy is not None
    ports = rules_by_port(policy)
    assert ports[POOLER_METRICS_PORT] == [MONITORING_PODS, OPERATOR_PODS]
    quiet = pooler_network_policy(c, OperatorPeer("pg-operator-system", monitoring_namespace=""))
    assert rules_by_port(quiet or {})[POOLER_METRICS_PORT] == [OPERATOR_PODS]
    chosen = [{"ipBlock": {"cidr": "10.1.2.3/32"}}]
    given = pooler_network_policy(cluster(pooler={}, networkPolicy={"metricsFrom": chosen}), IN_CLUSTER)
    assert rules_by_port(given or {})[POOLER_METRICS_PORT] == chosen
