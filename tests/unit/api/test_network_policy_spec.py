"""spec.networkPolicy: on by default, the peers Kubernetes accepts, refusals that name the field (the
same rules the CRD carries as CEL; tests/e2e/test_cluster_network_policy.py has the API server refuse
them)."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.network_policy import cidr_problem


def obj(**spec: Any) -> dict[str, Any]:
    base = {"replicas": 1, "version": "16", "storage": "1Gi"}
    return {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u1"}, "spec": base | spec}


def parsed(policy: dict[str, Any]) -> PostgresCluster:
    return PostgresCluster.from_obj(obj(networkPolicy=policy))


def refused(policy: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        parsed(policy)
    return str(info.value)


def test_on_by_default_with_no_peers_named() -> None:
    spec = PostgresCluster.from_obj(obj()).spec.network_policy
    assert spec.enabled is True
    assert spec.allow_from is None and spec.metrics_from is None


def test_peers_kubernetes_accepts() -> None:
    spec = parsed({"allowFrom": [
        {"podSelector": {}},
        {"namespaceSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}},
         "podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}},
        {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}},
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]}).spec.network_policy  # fmt: skip
    assert spec.allow_from is not None and len(spec.allow_from) == 5
    dumped = spec.allow_from[3].model_dump(by_alias=True, exclude_none=True)
    assert dumped == {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}}


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ({}, "either an ipBlock or a podSelector"),
        ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "either an ipBlock or a podSelector"),
        ({"ipBlock": {"cidr": "10.0.0.0"}}, "prefix length is missing"),
        ({"ipBlock": {"cidr": "not-a-cidr"}}, "must be a CIDR"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}, "must lie inside"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}, "be smaller"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/16"]}}, "must lie inside"),
        ({"podSelector": {"matchLabels": {"bad key!": "x"}}}, "must be a label key"),
        ({"podSelector": {"matchLabels": {"app": "-bad"}}}, "must be a label value"),
        ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}, "need values"),
        ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}},
         "take none"),
        ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["a"]}]}},
         "operator"),
        ({"podSelector": {"matchLabels": {"app": "a"}, "surprise": 1}}, "surprise"),
    ],
)  # fmt: skip
def test_bad_peers_are_refused_naming_the_field(peer: dict[str, Any], expected: str) -> None:
    message = refused({"allowFrom": [peer]})
    assert "spec.networkPolicy.allowFrom.0" in message, message
    assert expected in message, message


def test_metrics_from_is_checked_the_same_way() -> None:
    message = refused({"metricsFrom": [{"ipBlock": {"cidr": "300.0.0.0/8"}}]})
    assert "spec.networkPolicy.metricsFrom.0" in message and "must be a CIDR" in message, message


def test_enabled_must_be_a_boolean() -> None:
    assert "spec.networkPolicy.enabled" in refused({"enabled": "sometimes"})


def test_cidr_problem() -> None:
    assert cidr_problem("10.0.0.0/8") is None
    assert cidr_problem("10.0.0.1/8") is None  # host bits set: Kubernetes accepts it too
    assert cidr_problem("::/0") is None
    assert cidr_problem("10.0.0.0/33") is not None
    assert cidr_problem("") is not None
