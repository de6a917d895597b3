"""Who may scrape the instances, as the operator applies it on the kwok cluster: with `metricsFrom` unset,
the monitoring namespace the operator was started with (`--monitoring-namespace`), the cluster's own pods
and the operator; never every namespace. A cluster's own `metricsFrom` replaces that."""

from __future__ import annotations

from typing import Any

from harness.kube import apply, get_or_none, make_namespace
from harness.objects import cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.waiting import wait_until

MONITORING_NAMESPACE = "observability"
OPERATOR = OperatorSpec("metrics-policy", ("--monitoring-namespace", MONITORING_NAMESPACE))


def metrics_peers(kube: Any, namespace: str, name: str) -> list[dict[str, Any]] | None:
    policy = get_or_none(kube, "networkpolicies.networking.k8s.io", name, "-n", namespace)
    if policy is None:
        return None
    rules = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 9187}]]
    return rules[0]["from"] if rules else []


def test_the_applied_policy_admits_the_named_monitoring_namespace_only(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "scrape")
    try:
        apply(kube, cluster("quiet-db", ns, replicas=1))
        peers = wait_until("the NetworkPolicy of quiet-db", lambda: metrics_peers(kube, ns, "quiet-db"), 60)
        assert peers[0] == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}
        }
        assert {"namespaceSelector": {}} not in peers
        assert all("namespaceSelector" not in p or p["namespaceSelector"].get("matchLabels") for p in peers)

        chosen = [{"ipBlock": {"cidr": "10.99.0.0/16"}}]
        apply(kube, cluster("chosen-db", ns, replicas=1, networkPolicy={"metricsFrom": chosen}))
        given = wait_until("the NetworkPolicy of chosen-db", lambda: metrics_peers(kube, ns, "chosen-db"), 60)
        assert given == chosen
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")
