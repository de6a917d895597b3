"""The operator against the real API server (kwok profile): create, report, scale, resync without writes,
survive kill -9, degrade on a missing StorageClass and recover, report a pass the API server refuses
and recover, report Ready only once the -rw Service routes to the primary, and garbage-collect on
delete."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import yaml

from harness.kube import apply, condition, events_for, get_json, get_or_none, make_namespace
from harness.kwok_status import cluster_obj, wait_ready
from harness.objects import CLUSTER_LABEL, cluster, storage_class
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec, reconcile_passes
from harness.paths import REPO
from harness.waiting import wait_until
from pg_operator.api.cluster import PostgresCluster
from pg_operator.controller.diff import object_differences, with_hash
from pg_operator.orchestration.nodes import NodeView, node_view
from pg_operator.specs import desired_children, secret_names
from pg_operator.specs.tls import tls_secret_names

RESYNC = 12.0
OPERATOR = OperatorSpec("lifecycle", ("--resync-seconds", str(RESYNC)))
KINDS = {  # kubectl names of every kind a cluster owns, by (apiVersion, kind)
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles.rbac.authorization.k8s.io",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings.rbac.authorization.k8s.io",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("apps/v1", "StatefulSet"): "statefulsets.apps",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets.policy",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies.networking.k8s.io",
    ("v1", "Secret"): "secrets",
}


@pytest.fixture(scope="module")
def orders_db(operator_env: OperatorEnv, operator: OperatorProcess) -> dict[str, Any]:
    kube = operator_env.kube
    kube.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    return {"namespace": "shop", "name": "orders-db"}


def owned_objects(kube: Any, ns: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) → object, of every object of the owned kinds carrying the cluster label."""
    out = {}
    items = get_json(kube, ",".join(KINDS.values()), "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]
    for obj in items:
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


def nodes_seen(kube: Any) -> list[NodeView]:
    """The Nodes as the operator reads them (it may: a cluster-wide operator), for the budgets it makes
    when it handles drains (specs/pdb.py)."""
    return [node_view(n) for n in get_json(kube, "nodes")["items"]]


def expected_names(kube: Any, ns: str, name: str) -> set[tuple[str, str]]:
    cluster = PostgresCluster.from_obj(cluster_obj(kube, ns, name))
    names = {(c["kind"], c["metadata"]["name"]) for c in desired_children(cluster, nodes=nodes_seen(kube))}
    return names | {("Secret", s) for s in secret_names(cluster) + tls_secret_names(cluster)}


def assert_children_match(kube: Any, ns: str, name: str) -> None:
    obj = cluster_obj(kube, ns, name)
    cluster = PostgresCluster.from_obj(obj)
    sts = get_or_none(kube, "statefulset", name, "-n", ns)
    for desired in desired_children(cluster, existing_statefulset=sts, nodes=nodes_seen(kube)):
        observed = get_or_none(
            kube, KINDS[(desired["apiVersion"], desired["kind"])], desired["metadata"]["name"], "-n", ns
        )
        assert observed is not None, f"{desired['kind']} {desired['metadata']['name']} missing"
        assert object_differences(with_hash(desired), observed) == [], f"{desired['kind']} differs"
        refs = observed["metadata"].get("ownerReferences") or []
        assert any(r["uid"] == obj["metadata"]["uid"] and r.get("controller") for r in refs)


def wait_children(kube: Any, ns: str, name: str, timeout: float = 60) -> None:
    def complete() -> bool:
        return expected_names(kube, ns, name) <= set(owned_objects(kube, ns, name))

    wait_until(f"every child of {ns}/{name}", complete, timeout)


def test_example_creates_every_child_with_the_built_spec(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns, name = orders_db["namespace"], orders_db["name"]
    wait_children(kube, ns, name)
    assert_children_match(kube, ns, name)
    for secret in ("superuser", "replication", "app", "patroni-api"):
        data = get_json(kube, "secret", f"{name}-{secret}", "-n", ns)["data"]
        assert {"username", "password"} <= set(data), f"secret {secret} lacks username/password"
    # nothing of the operator's logs carries a password
    log = operator.log_text()
    for secret in ("superuser", "replication", "app", "patroni-api"):
        import base64

        password = base64.b64decode(
            get_json(kube, "secret", f"{name}-{secret}", "-n", ns)["data"]["password"]
        )
        assert password.decode() not in log


def test_kubectl_get_pgc_prints_the_columns(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    crd = yaml.safe_load((REPO / "deploy" / "crd" / "postgresclusters.yaml").read_text())
    columns = [
        c["name"].upper()
        for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
        if not c.get("priority")
    ]
    out = operator_env.kube.kubectl("get", "pgc", "-n", "shop").stdout
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", *columns]
    assert rows and rows[0].split()[0] == "orders-db"


def test_status_reaches_ready_when_the_pods_are_ready(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    obj = wait_ready(kube, "shop", "orders-db", 3)
    status = obj["status"]
    assert status["phase"] == "Healthy"
    assert status["currentPrimary"] == "orders-db-0"
    assert [i["name"] for i in status["instances"]] == ["orders-db-0", "orders-db-1", "orders-db-2"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    row = kube.kubectl("get", "pgc", "orders-db", "-n", "shop", "--no-headers").stdout.split()
    assert "orders-db-0" in row and "Healthy" in row
    reasons = [e["reason"] for e in events_for(kube, "shop", "orders-db")]
    assert "Created" in reasons


def test_a_resync_makes_zero_writes(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    env = operator_env
    wait_ready(env.kube, "shop", "orders-db", 3)
    mark = env.audit.settled()  # the last status write and its watch event are done
    before = reconcile_passes(operator)
    noop_before = operator.metric('pg_operator_reconcile_total{result="noop"}')
    time.sleep(RESYNC * 1.1 + 3)  # at least one full (jittered) resync of every cluster
    after = reconcile_passes(operator)
    assert after > before, "no reconcile ran during the resync window"
    assert operator.metric('pg_operator_reconcile_total{result="noop"}') > noop_before
    writes = env.audit.writes_since(mark)
    assert writes == {}, f"a no-op resync wrote: {dict(writes)}"
    reads = env.audit.requests_since(mark)
    non_watch = {k: v for k, v in reads.items() if k[0] not in ("watch",)}
    print(
        f"\nresync window: {after - before:.0f} reconcile passes, requests besides watches/lease: {non_watch}"
    )


def test_scaling_follows_and_the_pdb_goes_at_one(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    for replicas in (5, 1):
        kube.kubectl(
            "patch",
            "pgc",
            "orders-db",
            "-n",
            "shop",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"replicas": replicas}}),
        )
        wait_until(
            f"StatefulSet at {replicas}",
            lambda r=replicas: (
                get_json(kube, "statefulset", "orders-db", "-n", "shop")["spec"]["replicas"] == r
            ),
        )
        obj = wait_ready(kube, "shop", "orders-db", replicas)
        assert obj["status"]["replicas"] == replicas
        pdb = get_or_none(kube, "poddisruptionbudget", "orders-db", "-n", "shop")
        if replicas > 1:
            assert pdb is not None
        else:
            wait_until(
                "the PDB to be deleted at 1 instance",
                lambda: get_or_none(kube, "poddisruptionbudget", "orders-db", "-n", "shop") is None,
            )
        assert_children_match(kube, "shop", "orders-db")
    messages = [e["message"] for e in events_for(kube, "shop", "orders-db") if e["reason"] == "Scaled"]
    assert any("3 to 5" in m for m in messages) and any("5 to 1" in m for m in messages), messages


def test_kill_9_mid_reconcile_then_restart_converges(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    env = operator_env
    kube = env.kube
    ns = make_namespace(kube, "kill")
    mark = env.audit.mark()
    apply(kube, cluster("kill-db", ns, replicas=3))

    def half_way() -> bool:  # the Services are applied, the StatefulSet is being applied
        return f"applying StatefulSet {ns}/kill-db " in operator.log_text()

    wait_until("the operator to be half-way through kill-db", half_way, timeout=30, interval=0.01)
    operator.kill9()
    partial = owned_objects(kube, ns, "kill-db")
    operator.restart().wait_leader()
    wait_children(kube, ns, "kill-db")
    wait_ready(kube, ns, "kill-db", 3)
    assert_children_match(kube, ns, "kill-db")
    assert set(owned_objects(kube, ns, "kill-db")) == expected_names(kube, ns, "kill-db"), "orphans left"
    creates = env.audit.writes_since(mark)
    parsed = PostgresCluster.from_obj(cluster_obj(kube, ns, "kill-db"))
    secrets = len(secret_names(parsed) + tls_secret_names(parsed))
    assert creates.get(("create", "secrets"), 0) == secrets, (
        f"Secrets created more than once: {dict(creates)}"
    )
    for key, obj in partial.items():  # what existed before the kill is the same object afterwards
        again = owned_objects(kube, ns, "kill-db")[key]
        assert again["metadata"]["uid"] == obj["metadata"]["uid"], f"{key} was recreated"
    print(f"\nkilled with {len(partial)} of {len(expected_names(kube, ns, 'kill-db'))} children created")
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_missing_storage_class_degrades_then_recovers(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "sc")
    klass = f"pgop-test-{uuid.uuid4().hex[:6]}"
    apply(kube, cluster("sc-db", ns, replicas=1, storageClassName=klass))

    def degraded() -> bool:
        cond = condition(cluster_obj(kube, ns, "sc-db"), "Degraded")
        return cond.get("status") == "True" and cond.get("reason") == "StorageClassNotFound"

    wait_until("Degraded: StorageClassNotFound", degraded)
    assert get_or_none(kube, "statefulset", "sc-db", "-n", ns) is None
    assert cluster_obj(kube, ns, "sc-db")["status"]["phase"].startswith("Degraded")
    warnings = [e for e in events_for(kube, ns, "sc-db") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["StorageClassNotFound"]
    apply(kube, storage_class(klass))
    try:
        wait_until(
            "the StatefulSet once the class exists",
            lambda: get_or_none(kube, "statefulset", "sc-db", "-n", ns) is not None,
        )
        # Generous: on a loaded 2-core machine the claim, the fake pod and the status take a while.
        wait_until(
            "Degraded to clear",
            lambda: condition(cluster_obj(kube, ns, "sc-db"), "Degraded").get("status") == "False",
            timeout=180,
        )
        wait_ready(kube, ns, "sc-db", 1)
        reasons = [e["reason"] for e in events_for(kube, ns, "sc-db")]
        assert "Recovered" in reasons
        assert f"reconcile of {ns}/sc-db failed" not in operator.log_text(), "it retried as if transient"
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")
        kube.kubectl("delete", "storageclass", klass, "--wait=false")


def rw_endpoints(kube: Any, ns: str, name: str) -> dict[str, bool]:
    """Pod → ready, as the endpointslice controller lists them in the -rw Service's slices; each slice
    carries the Service's cluster label (what the operator's watch of them selects on)."""
    slices = get_json(kube, "endpointslices.discovery.k8s.io", "-n", ns,
                      "-l", f"kubernetes.io/service-name={name}-rw")["items"]  # fmt: skip
    out = {}
    for item in slices:
        assert item["metadata"]["labels"].get(CLUSTER_LABEL) == name, item["metadata"]
        for endpoint in item.get("endpoints") or ():
            ready = (endpoint.get("conditions") or {}).get("ready") is not False
            out[(endpoint.get("targetRef") or {}).get("name")] = ready
    return out


def test_a_refused_pass_is_degraded_with_one_warning_then_recovers(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    """A ResourceQuota that allows no StatefulSet: the schema admits the cluster, the API server
    refuses the operator's StatefulSet on every retry."""
    kube = operator_env.kube
    ns = make_namespace(kube, "quota")
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-sts", "namespace": ns},
             "spec": {"hard": {"count/statefulsets.apps": "0"}}}  # fmt: skip
    apply(kube, quota)
    try:
        wait_until("the quota to be counted", lambda: get_json(kube, "resourcequota", "no-sts", "-n", ns)
                   .get("status", {}).get("hard"))  # fmt: skip
        apply(kube, cluster("quota-db", ns, replicas=1))

        def degraded() -> dict[str, Any] | None:
            cond = condition(cluster_obj(kube, ns, "quota-db"), "Degraded")
            return cond if cond.get("status") == "True" and cond.get("reason") == "ReconcileFailed" else None

        cond = wait_until("Degraded: ReconcileFailed", degraded, timeout=60)
        assert "statefulsets quota-db" in cond["message"], cond
        assert "exceeded quota: no-sts" in cond["message"], cond
        assert cluster_obj(kube, ns, "quota-db")["status"]["phase"] == "Degraded: ReconcileFailed"
        # Retries go on (backoff), the Event is not repeated for them.
        wait_until("three retries", lambda: f"reconcile of {ns}/quota-db failed (4 in a row)"
                   in operator.log_text(), timeout=60)  # fmt: skip
        warnings = [e for e in events_for(kube, ns, "quota-db") if e["type"] == "Warning"]
        assert [(e["reason"], e["message"]) for e in warnings] == [("ReconcileFailed", cond["message"])]
        assert warnings[0].get("count", 1) == 1, warnings
    finally:
        kube.kubectl("delete", "resourcequota", "no-sts", "-n", ns)
    try:
        wait_until("Degraded to clear",
                   lambda: condition(cluster_obj(kube, ns, "quota-db"), "Degraded").get("status") == "False",
                   timeout=90)  # fmt: skip
        assert get_or_none(kube, "statefulset", "quota-db", "-n", ns) is not None
        wait_ready(kube, ns, "quota-db", 1)
        assert "Recovered" in [e["reason"] for e in events_for(kube, ns, "quota-db")]
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_ready_waits_until_the_rw_service_routes_to_the_primary(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    """The pod says it is the primary with the label older Patroni versions set (role=master): the
    operator counts it as a ready primary, but the -rw Service selects role=primary, so its slice does
    not list the pod and clients through -rw are refused: Ready stays False until the label is right."""
    kube = operator_env.kube
    ns = make_namespace(kube, "route")
    apply(kube, cluster("route-db", ns, replicas=1))
    try:
        wait_until("the pod", lambda: get_or_none(kube, "pod", "route-db-0", "-n", ns), timeout=60)
        kube.kubectl("label", "pod", "route-db-0", "-n", ns, "role=master", "--overwrite")

        def counted_ready() -> dict[str, Any] | None:
            st = cluster_obj(kube, ns, "route-db").get("status") or {}
            return st if st.get("readyReplicas") == 1 and st.get("currentPrimary") == "route-db-0" else None

        wait_until("the instance counted ready and primary", counted_ready, timeout=60)
        time.sleep(3)  # the endpointslice controller and the operator's pass on its slice have had time
        obj = cluster_obj(kube, ns, "route-db")
        assert "route-db-0" not in rw_endpoints(kube, ns, "route-db")
        ready = condition(obj, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "PrimaryNotRouted"), ready
        assert ready["message"] == "the route-db-rw Service does not route to route-db-0 yet"
        assert obj["status"]["phase"] == "Creating"
        kube.kubectl("label", "pod", "route-db-0", "-n", ns, "role=primary", "--overwrite")

        def ready_now() -> dict[str, Any] | None:
            o = cluster_obj(kube, ns, "route-db")
            return dict(o) if condition(o, "Ready").get("status") == "True" else None

        obj = wait_until("Ready", ready_now, timeout=60)
        assert rw_endpoints(kube, ns, "route-db") == {"route-db-0": True}
        assert obj["status"]["phase"] == "Healthy"
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_deleting_the_cluster_garbage_collects_its_children(
    orders_db: dict[str, Any], operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    assert owned_objects(kube, "shop", "orders-db")
    kube.kubectl("delete", "pgc", "orders-db", "-n", "shop")
    wait_until(
        "every child to be garbage-collected",
        lambda: not owned_objects(kube, "shop", "orders-db"),
        timeout=90,
    )
    wait_until(
        "the pods to go",
        lambda: not get_json(kube, "pods", "-n", "shop", "-l", f"{CLUSTER_LABEL}=orders-db")["items"],
        timeout=90,
    )
    kube.kubectl("delete", "namespace", "shop", "--wait=false")
