"""The instance pods' Role: what Patroni uses (ConfigMaps mode), by name wherever Kubernetes allows."""

from __future__ import annotations

from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.specs import rbac

# Verbs the authorizer can check against a resource name; list, watch and create it cannot (a create's
# name is not known when it is authorized; list and watch name no object).
NAMEABLE = {"get", "update", "patch", "delete"}


def allowed(rules: list[dict[str, Any]], resource: str, verb: str, name: str | None) -> bool:
    """What RBAC's rule matching says (apiGroup "" only): a rule with resourceNames matches only a
    request that names one of them."""
    for rule in rules:
        if resource not in rule["resources"] or verb not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if not names or (name is not None and name in names):
            return True
    return False


def test_pods_patch_only_the_clusters_own_members_by_name() -> None:
    rules = rbac.role(cluster(name="orders-db", replicas=3))["rules"]
    # Every ordinal the API admits (replicas ≤ 5), so a scale-up needs no new Role.
    for ordinal in range(5):
        assert allowed(rules, "pods", "patch", f"orders-db-{ordinal}")
    for other in ("orders-db-5", "billing-db-0", "orders-db-x", "orders"):
        assert not allowed(rules, "pods", "patch", other), other
    for verb in ("get", "update", "delete", "create", "deletecollection"):
        assert not allowed(rules, "pods", verb, "orders-db-0"), verb
    assert allowed(rules, "pods", "list", None) and allowed(rules, "pods", "watch", None)


def test_configmaps_written_by_name_are_patronis_four() -> None:
    rules = rbac.role(cluster(name="orders-db"))["rules"]
    for suffix in ("leader", "config", "failover", "sync"):
        assert allowed(rules, "configmaps", "get", f"orders-db-{suffix}")
        assert allowed(rules, "configmaps", "patch", f"orders-db-{suffix}")
    # Not the operator's own instance ConfigMap, not another cluster's lock.
    for other in ("orders-db-instance", "billing-db-leader", "orders-db-status", "kube-root-ca.crt"):
        assert not allowed(rules, "configmaps", "patch", other), other
        assert not allowed(rules, "configmaps", "get", other), other
    for verb in ("update", "delete", "deletecollection"):
        assert not allowed(rules, "configmaps", verb, "orders-db-leader"), verb
    for verb in ("list", "watch", "create"):
        assert allowed(rules, "configmaps", verb, None), verb


def test_no_other_resource_and_names_only_on_nameable_verbs() -> None:
    rules = rbac.role(cluster(name="orders-db"))["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"pods", "configmaps"}
    for resource in ("endpoints", "services", "secrets", "pods/exec"):
        assert not any(allowed(rules, resource, verb, None) for verb in ("get", "list", "create")), resource
    for rule in rules:
        assert rule["apiGroups"] == [""]
        if "resourceNames" in rule:
            assert set(rule["verbs"]) <= NAMEABLE, rule
        else:
            assert set(rule["verbs"]) <= {"list", "watch", "create"}, rule


def test_names_follow_the_cluster() -> None:
    assert rbac.patroni_configmap_names(cluster(name="a")) == ["a-leader", "a-config", "a-failover", "a-sync"]
    assert rbac.member_pod_names(cluster(name="a")) == [f"a-{i}" for i in range(5)]
    role = rbac.role(cluster(name="a"))
    assert role["metadata"]["name"] == "a-instance" and role["metadata"]["namespace"] == "shop"
