"""The namespaced install (deploy/namespaced/) on the kwok profile: its rights as the API server's
authorizer sees them (`kubectl auth can-i --as`), and an operator holding only those rights reconciling
the watched namespaces and ignoring another one. Also the instance pods' Role, by name.

The module switches the session's operator identity (ServiceAccount pg-operator in pg-operator-system)
from the cluster-wide install to the namespaced one, as a user would: the overlay applied (all but the
Deployment: the operator runs out of cluster with that ServiceAccount's token and the Deployment's
--namespace flags), the ClusterRoleBinding deleted. The cluster-wide RBAC is put back afterwards for the
modules that follow.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.deployed_operator import namespaced_overlay, operator_namespaces
from harness.kube import KubectlLike, condition, get_json, get_or_none, make_namespace
from harness.kwok_status import wait_ready
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import (
    OPERATOR_USER,
    OperatorEnv,
    OperatorProcess,
    install_operator_identity,
    start_operator,
)
from harness.waiting import wait_until
from pg_operator.controller.reconcilers.storage import STORAGE_CLASSES_UNREADABLE


def can_i(kube: KubectlLike, user: str, verb: str, resource: str, *where: str) -> bool:
    """The API server's authorizer: may `user` do `verb` on `resource` (`where`: -n NS, or -A)?
    `resource` is kubectl's `kind[/name]`, or `kind:subresource` (e.g. pods:exec)."""
    kind, _, sub = resource.partition(":")
    extra = [f"--subresource={sub}"] if sub else []
    res = kube.kubectl("auth", "can-i", verb, kind, *extra, f"--as={user}", *where, check=False)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource} {where}: {answer!r} {res.stderr}"
    return answer == "yes"


@pytest.fixture(scope="module")
def namespaced(operator_env: OperatorEnv) -> Iterator[dict[str, Any]]:
    """Two watched namespaces and one unwatched; the overlay rendered for the watched two and applied
    (without its Deployment), the cluster-wide grant removed; restored afterwards."""
    kube = operator_env.kube
    watched = [make_namespace(kube, "nsd-a"), make_namespace(kube, "nsd-b")]
    unwatched = make_namespace(kube, "nsd-out")
    objects = namespaced_overlay(kube, operator_env.log_dir, watched)
    installed = [o for o in objects if o["kind"] != "Deployment"]
    try:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": installed}))  # fmt: skip
        kube.kubectl("delete", "clusterrolebinding", "pg-operator", "--ignore-not-found")
        yield {"watched": watched, "unwatched": unwatched, "objects": objects}
    finally:
        install_operator_identity(kube)  # the cluster-wide ClusterRoleBinding again
        for ns in [*watched, unwatched]:
            kube.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_the_overlay_holds_no_cluster_wide_grant(namespaced: dict[str, Any]) -> None:
    kinds = {(o["kind"], o["metadata"].get("namespace")) for o in namespaced["objects"]}
    assert not any(kind in ("ClusterRole", "ClusterRoleBinding") for kind, _ in kinds), kinds
    roles = {ns for kind, ns in kinds if kind == "Role"}
    assert roles == {*namespaced["watched"], "pg-operator-system"}
    assert operator_namespaces(namespaced["objects"]) == namespaced["watched"]


# What the operator does in a namespace it watches (deploy/operator/rbac.yaml explains each).
NEEDED = [
    ("list", "postgresclusters.db.example.com"), ("watch", "postgresclusters.db.example.com"),
    ("patch", "postgresclusters.db.example.com:status"), ("create", "backups.db.example.com"),
    ("create", "secrets"), ("patch", "secrets"), ("get", "secrets"), ("create", "pods:exec"),
    ("get", "pods:exec"), ("patch", "pods"), ("delete", "pods"), ("patch", "persistentvolumeclaims"),
    ("create", "statefulsets.apps"), ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"), ("create", "events"), ("patch", "configmaps"),
    ("list", "endpointslices.discovery.k8s.io"), ("create", "poddisruptionbudgets.policy"),
    ("create", "networkpolicies.networking.k8s.io"), ("delete", "networkpolicies.networking.k8s.io"),
]  # fmt: skip


def test_the_operator_may_do_what_it_needs_in_a_watched_namespace_only(
    operator_env: OperatorEnv, namespaced: dict[str, Any]
) -> None:
    kube = operator_env.kube
    for ns in namespaced["watched"]:
        refused = [(verb, res) for verb, res in NEEDED if not can_i(kube, OPERATOR_USER, verb, res, "-n", ns)]
        assert refused == [], f"in watched {ns}"
    out = namespaced["unwatched"]
    allowed = [(verb, res) for verb, res in NEEDED if can_i(kube, OPERATOR_USER, verb, res, "-n", out)]
    assert allowed == [], f"in unwatched {out}"
    # Nothing cluster-wide: no Secrets, pods, exec or clusters of every namespace, no StorageClasses,
    # not even its CRDs; its Lease in its own namespace only.
    for verb, res in [("list", "secrets"), ("get", "secrets"), ("list", "pods"), ("create", "pods:exec"),
                      ("list", "postgresclusters.db.example.com"), ("list", "configmaps"),
                      ("list", "storageclasses.storage.k8s.io"),
                      ("get", "customresourcedefinitions.apiextensions.k8s.io")]:  # fmt: skip
        assert not can_i(kube, OPERATOR_USER, verb, res, "-A"), f"{verb} {res} cluster-wide"
    assert can_i(kube, OPERATOR_USER, "update", "leases.coordination.k8s.io/pg-operator-leader",
                 "-n", "pg-operator-system")  # fmt: skip
    assert not can_i(kube, OPERATOR_USER, "update", "leases.coordination.k8s.io/pg-operator-leader",
                     "-n", namespaced["watched"][0])  # fmt: skip


@pytest.fixture(scope="module")
def namespaced_operator(operator_env: OperatorEnv, namespaced: dict[str, Any]) -> Iterator[OperatorProcess]:
    """The operator with the ServiceAccount's token and the rendered Deployment's --namespace flags."""
    flags = [f for ns in operator_namespaces(namespaced["objects"]) for f in ("--namespace", ns)]
    proc = start_operator(operator_env, "namespaced", *flags)
    try:
        proc.wait_leader()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"operator did not stop cleanly:\n{proc.log_text()[-3000:]}"


def children(kube: KubectlLike, ns: str, name: str) -> set[tuple[str, str]]:
    kinds = "statefulsets.apps,services,secrets,configmaps,roles.rbac.authorization.k8s.io,serviceaccounts"
    items = get_json(kube, kinds, "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]
    return {(o["kind"], o["metadata"]["name"]) for o in items}


def test_it_reconciles_the_watched_namespaces_and_ignores_the_other(
    operator_env: OperatorEnv, namespaced: dict[str, Any], namespaced_operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    a, b = namespaced["watched"]
    out = namespaced["unwatched"]
    kube.kubectl("apply", "-f", "-", input=json.dumps(cluster("db", out, replicas=1)))
    kube.kubectl("apply", "-f", "-", input=json.dumps(cluster("db", a, replicas=1)))
    # A class that does not exist: not checked here, so the StatefulSet is not held back for it.
    missing_class = cluster("db", b, replicas=1, storageClassName="no-such-class")
    kube.kubectl("apply", "-f", "-", input=json.dumps(missing_class))

    obj = wait_ready(kube, a, "db", 1, timeout=180)
    assert condition(obj, "Degraded").get("status") != "True", obj["status"]
    assert {("StatefulSet", "db"), ("Secret", "db-app"), ("Role", "db-instance")} <= children(kube, a, "db")
    wait_until(f"{b}/db's StatefulSet", lambda: get_or_none(kube, "statefulset", "db", "-n", b), 120)
    status_b = get_json(kube, "postgresclusters.db.example.com", "db", "-n", b).get("status") or {}
    reasons = {c.get("reason") for c in status_b.get("conditions") or ()}
    assert "StorageClassNotFound" not in reasons, status_b

    # The cluster outside has been there all along and is left alone: no child, no status, no Event.
    time.sleep(3)
    assert children(kube, out, "db") == set()
    assert not (get_json(kube, "postgresclusters.db.example.com", "db", "-n", out).get("status"))
    assert get_json(kube, "events", "-n", out)["items"] == []

    log = namespaced_operator.log_text()
    assert log.count(STORAGE_CLASSES_UNREADABLE) == 1, log[-3000:]
    # A refusal reads "forbidden" or carries status 403 (not to be confused with a timestamp's ",403").
    refused = re.search(r"forbidden|(?<![\d,.:])403(?!\d)", log, re.IGNORECASE)
    assert refused is None, log[max(0, (refused.start() if refused else 0) - 2000) :][:4000]


def test_the_instance_pods_role_is_by_name(
    operator_env: OperatorEnv, namespaced: dict[str, Any], namespaced_operator: OperatorProcess
) -> None:
    """The Role the (namespaced) operator made for the cluster's pods, as the authorizer applies it."""
    kube = operator_env.kube
    a = namespaced["watched"][0]
    wait_until(f"{a}/db-instance RoleBinding",
               lambda: get_or_none(kube, "rolebinding", "db-instance", "-n", a), 60)  # fmt: skip
    pod_sa = f"system:serviceaccount:{a}:db-instance"
    yes = [("patch", "pods/db-0"), ("patch", "pods/db-4"), ("list", "pods"), ("watch", "pods"),
           ("create", "configmaps"), ("list", "configmaps"), ("get", "configmaps/db-leader"),
           ("patch", "configmaps/db-leader"), ("patch", "configmaps/db-config"),
           ("patch", "configmaps/db-failover"), ("patch", "configmaps/db-sync")]  # fmt: skip
    no = [("patch", "pods/other-0"), ("patch", "pods/db-5"), ("get", "pods/db-0"), ("update", "pods/db-0"),
          ("delete", "pods/db-0"), ("patch", "configmaps/db-instance"), ("patch", "configmaps/other-leader"),
          ("update", "configmaps/db-leader"), ("delete", "configmaps/db-leader"), ("get", "secrets"),
          ("create", "endpoints"), ("create", "services"), ("create", "pods:exec")]  # fmt: skip
    assert [q for q in yes if not can_i(kube, pod_sa, *q, "-n", a)] == []
    assert [q for q in no if can_i(kube, pod_sa, *q, "-n", a)] == []
    assert not can_i(kube, pod_sa, "list", "pods", "-n", namespaced["watched"][1])
