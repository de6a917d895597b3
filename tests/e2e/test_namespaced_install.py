"""The namespaced install (deploy/namespaced/) on real pods: create a cluster, fail over, delete it, with
the operator's ServiceAccount holding no ClusterRole (checked with the API server's authorizer).

Coexisting with the tier's cluster-wide operator: this module switches that install to the namespaced
one as docs/install.md tells a user (the overlay applied, watching one namespace of the module's own;
the ClusterRole and its binding deleted) and switches it back afterwards with the tier's own chart install.
It is the same Deployment, ServiceAccount and Lease throughout, so two operators never act at once, and
while the module runs nothing reconciles another namespace (the other modules' clusters are gone by
then: module fixtures delete their namespaces). One PostgresCluster of two instances, small requests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from harness.deployed_operator import (
    E2E_OPERATOR_ARGS,
    OPERATOR_NAMESPACE,
    install_operator,
    namespaced_overlay,
    operator_namespaces,
)
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import OPERATOR_USER
from harness.pgcluster import SMALL, connect_app, healthy, wait_serving
from harness.waiting import wait_until
from pg_operator.controller.reconcilers.storage import STORAGE_CLASSES_UNREADABLE

NAME = "nsd-db"


def can_i(kube: Kube, verb: str, resource: str, *where: str) -> bool:
    kind, _, sub = resource.partition(":")
    extra = [f"--subresource={sub}"] if sub else []
    res = kube.kubectl("auth", "can-i", verb, kind, *extra, f"--as={OPERATOR_USER}", *where, check=False)
    assert res.stdout.strip() in ("yes", "no"), res.stderr
    return res.stdout.strip() == "yes"


def rollout(kube: Kube) -> None:
    kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                 "--timeout=300s", timeout=320)  # fmt: skip


@pytest.fixture(scope="module")
def watched(operator: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The install switched to the namespaced overlay watching one new namespace; switched back after."""
    ns = f"nsd-{uuid.uuid4().hex[:6]}"
    operator.kubectl("create", "namespace", ns)
    objects = namespaced_overlay(operator, tmp_path_factory.mktemp("namespaced"), [ns])
    assert operator_namespaces(objects) == [ns]
    try:
        listing = {"apiVersion": "v1", "kind": "List", "items": objects}
        operator.kubectl("apply", "-f", "-", input=json.dumps(listing))
        operator.kubectl("delete", "clusterrolebinding", "pg-operator", "--ignore-not-found")
        operator.kubectl("delete", "clusterrole", "pg-operator", "--ignore-not-found")
        rollout(operator)
        yield ns
    finally:
        operator.kubectl("delete", "namespace", ns, "--ignore-not-found", timeout=300)
        operator.kubectl("delete", "role,rolebinding", "pg-operator", "-n", ns, "--ignore-not-found")
        # The tier's own cluster-wide install again, with the tier's flags (plain-HTTP test stores, the
        # short CA trust period): the modules after this one rely on them.
        install_operator(operator, E2E_OPERATOR_ARGS)
        rollout(operator)


def test_the_operator_holds_no_cluster_wide_grant(operator: Kube, watched: str) -> None:
    assert can_i(operator, "create", "pods:exec", "-n", watched)
    assert can_i(operator, "create", "secrets", "-n", watched)
    for verb, resource in [("list", "secrets"), ("create", "pods:exec"), ("patch", "pods"),
                           ("list", "postgresclusters.db.example.com"),
                           ("list", "storageclasses.storage.k8s.io"),
                           ("get", "customresourcedefinitions.apiextensions.k8s.io")]:  # fmt: skip
        assert not can_i(operator, verb, resource, "-A"), f"{verb} {resource} cluster-wide"
    assert not can_i(operator, "create", "pods:exec", "-n", "default")
    # Nothing bound to the ServiceAccount cluster-wide.
    bindings = get_json(operator, "clusterrolebindings")["items"]
    bound = [b["metadata"]["name"] for b in bindings for s in b.get("subjects") or ()
             if s.get("kind") == "ServiceAccount" and s.get("name") == "pg-operator"
             and s.get("namespace") == OPERATOR_NAMESPACE]  # fmt: skip
    assert bound == []


def leader_log(kube: Kube) -> str:
    selector = "app.kubernetes.io/name=pg-operator"
    pods = get_json(kube, "pods", "-n", OPERATOR_NAMESPACE, "-l", selector)["items"]
    return "\n".join(kube.kubectl("logs", "-n", OPERATOR_NAMESPACE, p["metadata"]["name"], check=False).stdout
                     for p in pods)  # fmt: skip


def test_create_fail_over_delete(operator: Kube, watched: str) -> None:
    body = cluster(NAME, watched, replicas=2, resources=SMALL)
    operator.kubectl("apply", "-f", "-", input=json.dumps(body))
    first = wait_serving(operator, watched, NAME, 2, 900)["currentPrimary"]
    with connect_app(operator, watched, NAME) as conn:
        conn.execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
    # The pods' Role is Patroni's, by name: it was enough to elect a leader and label the pods.
    role = get_json(operator, "role", f"{NAME}-instance", "-n", watched)
    named = {n for rule in role["rules"] for n in rule.get("resourceNames") or ()}
    assert f"{NAME}-0" in named and f"{NAME}-leader" in named

    operator.kubectl("delete", "pod", first, "-n", watched, "--wait=false")
    st = wait_until("a replica to take over and the cluster to be healthy again",
                    lambda: (s := healthy(operator, watched, NAME, 2)) and s["currentPrimary"] != first and s,
                    300, 2)  # fmt: skip
    wait_serving(operator, watched, NAME, 2, 300)
    with connect_app(operator, watched, NAME) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
    assert row == (1,), f"after failover to {st['currentPrimary']}"
    assert STORAGE_CLASSES_UNREADABLE in leader_log(operator)

    operator.kubectl("delete", "pgc", NAME, "-n", watched, timeout=300)
    kinds = "statefulsets.apps,services,secrets,roles.rbac.authorization.k8s.io,pods"
    wait_until("the cluster's children to be garbage-collected",
               lambda: not get_json(operator, kinds, "-n", watched, "-l", f"{CLUSTER_LABEL}={NAME}")["items"],
               300, 2)  # fmt: skip
    assert get_or_none(operator, "pgc", NAME, "-n", watched) is None
