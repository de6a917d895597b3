"""The backup schemas on the real API server (kwok profile): the Backup and ScheduledBackup CRDs, and the
PostgresCluster CRD with `spec.backup`, `spec.bootstrap.recovery` and the root rule, exactly as generated
(deploy/crd/ holds the same text: the manifests drift check). The three are installed under throwaway
kinds, so this test neither needs nor disturbs the real CRDs, and removed at the end. Objects are dry-run
created, except one that checks that bootstrap.recovery cannot change. The operator's ClusterRole from
deploy/operator/rbac.yaml is checked with the API server's own authorizer (under a throwaway name).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.kube import wait_established
from harness.local_cluster import Kube
from harness.paths import REPO
from pg_operator.api.backup import BACKUP, SCHEDULED_BACKUP
from pg_operator.api.cluster import POSTGRES_CLUSTER
from pg_operator.api.constants import GROUP
from pg_operator.api.crd import build
from pg_operator.backup.archiving import ARCHIVING_PARAMETERS

KINDS = {
    "Backup": "PgbkTestBackup",
    "ScheduledBackup": "PgbkTestScheduled",
    "PostgresCluster": "PgbkTestCluster",
}
S3 = {
    "bucket": "backups",
    "path": "prod",
    "endpointURL": "http://minio:9000",
    "credentials": {"secretName": "s3"},
}
CLUSTER = {"replicas": 1, "version": "16", "storage": "1Gi"}


def renamed(definition: dict[str, Any], kind: str) -> dict[str, Any]:
    plural = kind.lower() + "s"
    definition["metadata"]["name"] = f"{plural}.{GROUP}"
    definition["spec"]["names"] = {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                                   "singular": kind.lower()}  # fmt: skip
    return definition


def cluster_crd() -> dict[str, Any]:
    """The generated PostgresCluster CRD (with the backup fields), under its throwaway kind."""
    definition = build(POSTGRES_CLUSTER)
    # The scale subresource needs nothing renamed; the printer columns and schema stay as generated.
    return renamed(definition, KINDS["PostgresCluster"])


@pytest.fixture(scope="module")
def crds(kube: Kube) -> Iterator[None]:
    definitions = [
        renamed(build(BACKUP), KINDS["Backup"]),
        renamed(build(SCHEDULED_BACKUP), KINDS["ScheduledBackup"]),
        cluster_crd(),
    ]
    names = [f"crd/{d['metadata']['name']}" for d in definitions]
    try:
        items = json.dumps({"apiVersion": "v1", "kind": "List", "items": definitions})
        kube.kubectl("apply", "--server-side", "-f", "-", input=items)
        wait_established(kube, *names)
        yield
    finally:
        kube.kubectl("delete", "--ignore-not-found", "--wait=false", *names, check=False)


def create(kube: Kube, kind: str, spec: dict[str, Any], name: str = "t1") -> Any:
    obj = {"apiVersion": f"{GROUP}/v1alpha1", "kind": KINDS[kind],
           "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip
    return kube.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj), check=False
    )


def accepted(res: Any) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def refused(res: Any, *needles: str) -> None:
    assert res.returncode != 0, f"accepted:\n{res.stdout}"
    for needle in needles:
        assert needle in res.stderr, f"{needle!r} not in:\n{res.stderr}"


def test_backup_kind(kube: Kube, crds: None) -> None:
    accepted(create(kube, "Backup", {"cluster": "orders-db"}, name="nightly-1"))
    refused(
        create(kube, "Backup", {"cluster": "orders-db"}, name="latest"), "metadata.name must not be one of"
    )
    refused(create(kube, "Backup", {"cluster": "Orders"}), "spec.cluster")
    refused(create(kube, "Backup", {}), "spec.cluster")


@pytest.mark.parametrize(
    "schedule", ["0 3 * * *", "*/15 8-18 * * 1-5", "0 0 1,15 * *", "@daily", "5 4 * * 7"]
)
def test_schedule_accepted(kube: Kube, crds: None, schedule: str) -> None:
    out = accepted(create(kube, "ScheduledBackup", {"cluster": "a", "schedule": schedule}))
    assert out["spec"]["suspend"] is False and out["spec"]["immediate"] is False


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [("61 * * * *", "five fields"), ("0 3 * *", "five fields"), ("0 24 * * *", "five fields"),
     ("0 0 0 * *", "five fields"), ("* * * 13 *", "five fields"), ("0 3 * * MON", "five fields"),
     ("5-1 * * * *", "a range a-b needs a <= b"), ("@reboot", "five fields")],
)  # fmt: skip
def test_schedule_refused(kube: Kube, crds: None, schedule: str, needle: str) -> None:
    refused(create(kube, "ScheduledBackup", {"cluster": "a", "schedule": schedule}), "spec.schedule", needle)


def test_cluster_backup_configuration(kube: Kube, crds: None) -> None:
    out = accepted(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3}}))
    backup = out["spec"]["backup"]
    assert backup["onDelete"] == "keep" and backup["compression"] == "gzip"
    assert backup["walMaxKeepSize"] == "10GB" and backup["archiveTimeout"] == "60s"
    assert backup["s3"]["credentials"]["accessKeyIDKey"] == "ACCESS_KEY_ID"
    for retention in ({"recoveryWindow": "7d"}, {"recoveryWindow": "4w"}, {"keepLast": 5}):
        accepted(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3, "retention": retention}}))
    refused(create(kube, "PostgresCluster",
                   {**CLUSTER, "backup": {"s3": S3, "retention": {"recoveryWindow": "7d", "keepLast": 2}}}),
            "set exactly one of recoveryWindow")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3, "retention": {}}}),
            "set exactly one of recoveryWindow")  # fmt: skip
    bad_window = {"s3": S3, "retention": {"recoveryWindow": "7x"}}
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": bad_window}),
            "spec.backup.retention.recoveryWindow")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3, "compression": "xz"}}),
            "spec.backup.compression")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": {**S3, "bucket": "Bad_Bucket"}}}),
            "spec.backup.s3.bucket")  # fmt: skip
    bad_endpoint = {"s3": {**S3, "endpointURL": "minio:9000"}}
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": bad_endpoint}),
            "spec.backup.s3.endpointURL")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3, "walMaxKeepSize": "10G"}}),
            "spec.backup.walMaxKeepSize")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3, "onDelete": "purge"}}),
            "spec.backup.onDelete")  # fmt: skip


def test_cluster_recovery(kube: Kube, crds: None) -> None:
    source = {"clusterName": "orders-db", "s3": S3}
    accepted(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3},
                    "bootstrap": {"recovery": {"source": source, "targetTime": "2026-12-01T08:00:00Z"}}},
                    name="orders-restored"))  # fmt: skip
    accepted(create(kube, "PostgresCluster", {**CLUSTER, "bootstrap": {"recovery": {"source": source,
                    "targetLSN": "0/3000060"}}}))  # fmt: skip
    # Its own name under the source's bucket and path would be the source's archive.
    refused(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": S3},
                   "bootstrap": {"recovery": {"source": source}}}, name="orders-db"),
            "would archive into its source's path")  # fmt: skip
    accepted(create(kube, "PostgresCluster", {**CLUSTER, "backup": {"s3": {**S3, "path": "restored"}},
                    "bootstrap": {"recovery": {"source": source}}}, name="orders-db"))  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "bootstrap": {"recovery": {"source": source,
                   "targetTime": "2026-12-01T08:00:00Z", "targetLSN": "0/3000060"}}}),
            "at most one of targetTime and targetLSN")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "bootstrap": {"recovery": {"source": source,
                   "targetTime": "2026-12-01 08:00"}}}), "spec.bootstrap.recovery.targetTime")  # fmt: skip
    no_such_day = {"source": source, "targetTime": "2026-02-30T08:00:00Z"}
    refused(create(kube, "PostgresCluster", {**CLUSTER, "bootstrap": {"recovery": no_such_day}}),
            "spec.bootstrap.recovery.targetTime")  # fmt: skip
    refused(create(kube, "PostgresCluster", {**CLUSTER, "bootstrap": {"recovery": {"source": source,
                   "targetLSN": "3000060"}}}), "spec.bootstrap.recovery.targetLSN")  # fmt: skip


@pytest.mark.parametrize("parameter", ARCHIVING_PARAMETERS)
def test_archiving_parameters_are_refused_naming_the_field(kube: Kube, crds: None, parameter: str) -> None:
    spec = {**CLUSTER, "postgresql": {"parameters": {parameter: "1"}}}
    refused(create(kube, "PostgresCluster", spec), "spec.postgresql.parameters",
            f"{parameter} is set by the operator")  # fmt: skip


def test_restore_with_the_default_application_database(kube: Kube, crds: None) -> None:
    source = {"clusterName": "orders-db", "s3": S3}
    spec = {**CLUSTER, "bootstrap": {"recovery": {"source": source}}}
    out = accepted(create(kube, "PostgresCluster", spec))
    bootstrap = out["spec"]["bootstrap"]
    # initdb keeps its defaults next to recovery: they name the owner whose password is reset after it.
    assert bootstrap["initdb"] == {"database": "app", "owner": "app"}
    assert bootstrap["recovery"]["source"]["s3"]["credentials"]["accessKeyIDKey"] == "ACCESS_KEY_ID"
    assert "backup" not in out["spec"]


def test_recovery_cannot_change_after_creation(kube: Kube, crds: None) -> None:
    name = f"immutable-{uuid.uuid4().hex[:6]}"
    source = {"clusterName": "orders-db", "s3": S3}
    obj = {"apiVersion": f"{GROUP}/v1alpha1", "kind": KINDS["PostgresCluster"],
           "metadata": {"name": name, "namespace": "default"},
           "spec": {**CLUSTER, "bootstrap": {"recovery": {"source": source}}}}  # fmt: skip
    kube.kubectl("create", "-f", "-", input=json.dumps(obj))
    try:
        resource = f"{KINDS['PostgresCluster'].lower()}s.{GROUP}/{name}"
        for patch in ({"spec": {"bootstrap": {"recovery": {"targetLSN": "0/3000060"}}}},
                      {"spec": {"bootstrap": {"recovery": None}}}):  # fmt: skip
            res = kube.kubectl("patch", resource, "-n", "default", "--type=merge", "-p", json.dumps(patch),
                               check=False)  # fmt: skip
            refused(res, "spec.bootstrap", "bootstrap is applied once")
        # spec.backup may be added later (archiving starts with the rollout).
        res = kube.kubectl(
            "patch",
            resource,
            "-n",
            "default",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"backup": {"s3": {**S3, "path": "own"}}}}),
            check=False,
        )
        assert res.returncode == 0, res.stderr
    finally:
        kube.kubectl("delete", f"{KINDS['PostgresCluster'].lower()}s.{GROUP}", name, "-n", "default",
                     "--ignore-not-found", "--wait=false", check=False)  # fmt: skip


# --- the operator's RBAC for backups, by the API server's authorizer ----------------------------------------


@pytest.fixture(scope="module")
def operator_identity(kube: Kube) -> Iterator[str]:
    """The ClusterRole of deploy/operator/rbac.yaml under a throwaway name, bound to a throwaway
    ServiceAccount; yields the user name to impersonate."""
    suffix = uuid.uuid4().hex[:6]
    ns, role = f"pgbk-rbac-{suffix}", f"pgbk-rbac-{suffix}"
    (cluster_role,) = [d for d in yaml.safe_load_all((REPO / "deploy/operator/rbac.yaml").read_text())
                       if d and d["kind"] == "ClusterRole"]  # fmt: skip
    cluster_role["metadata"] = {"name": role}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]}  # fmt: skip
    try:
        kube.kubectl("create", "namespace", ns)
        kube.kubectl("create", "serviceaccount", "operator", "-n", ns)
        items = json.dumps({"apiVersion": "v1", "kind": "List", "items": [cluster_role, binding]})
        kube.kubectl("apply", "-f", "-", input=items)
        user = f"system:serviceaccount:{ns}:operator"
        # The RBAC authorizer learns of new bindings through its informers: wait until it has this one.
        deadline = time.monotonic() + 30
        while not can(kube, user, "list", "persistentvolumeclaims"):
            assert time.monotonic() < deadline, "the ClusterRoleBinding never took effect"
            time.sleep(0.5)
        yield user
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def can(kube: Kube, user: str, verb: str, resource: str) -> bool:
    """The authorizer's answer (a SubjectAccessReview: exact, and needs no discovery of the kinds, which
    are installed here only under throwaway names). `resource`: plural[.group][/subresource]."""
    plural_group, _, sub = resource.partition("/")
    plural, _, group = plural_group.partition(".")
    ns = user.split(":")[2]
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}",
                                                "system:authenticated"],
                       "resourceAttributes": {"namespace": "shop", "verb": verb, "group": group,
                                              "resource": plural, "subresource": sub}}}  # fmt: skip
    out = kube.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout
    allowed = bool(json.loads(out)["status"].get("allowed"))
    if not allowed:
        print(f"{verb} {resource}: not allowed")
    return allowed


# The verbs docs/security.md gives the operator on the backup kinds and why (its reads come from the watch
# cache, so no get; Backups are created by ScheduledBackups and major upgrades and deleted by retention;
# only the status is written), and those it must not have.
@pytest.mark.parametrize(
    ("verb", "resource"),
    [(v, f"backups.{GROUP}") for v in ("list", "watch", "create", "delete")]
    + [(v, f"scheduledbackups.{GROUP}") for v in ("list", "watch")]
    + [("patch", f"backups.{GROUP}/status"), ("patch", f"scheduledbackups.{GROUP}/status"),
       ("create", "pods/exec"), ("get", "pods/exec")],
)  # fmt: skip
def test_the_operator_may(kube: Kube, operator_identity: str, verb: str, resource: str) -> None:
    assert can(kube, operator_identity, verb, resource)


@pytest.mark.parametrize(
    ("verb", "resource"),
    [(v, f"backups.{GROUP}") for v in ("get", "update", "patch", "deletecollection")]
    + [(v, f"scheduledbackups.{GROUP}") for v in ("get", "create", "update", "patch", "delete")]
    + [("update", f"backups.{GROUP}/finalizers"), ("update", f"scheduledbackups.{GROUP}/finalizers"),
       ("update", f"backups.{GROUP}/status"), ("create", "pods/attach"), ("create", "pods/portforward"),
       ("update", "secrets")],
)  # fmt: skip
def test_the_operator_may_not(kube: Kube, operator_identity: str, verb: str, resource: str) -> None:
    assert not can(kube, operator_identity, verb, resource)


def test_a_websocket_exec_with_the_operators_role_is_allowed(kube: Kube, operator_identity: str) -> None:
    """kubectl (like the controller's pod_exec) execs over a WebSocket, an HTTP GET: whatever verbs the
    API server checks for it, the ClusterRole must satisfy them. The pod is on a kwok node, so the
    command itself cannot run; only the authorizer's answer matters."""
    ns = operator_identity.split(":")[2]
    nodes = json.loads(kube.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    container = {"name": "postgres", "image": "localhost/pg-operator/postgres:16.15"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "target", "namespace": ns},
           "spec": {"nodeName": nodes[0]["metadata"]["name"], "containers": [container]}}  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(pod))
    res = kube.kubectl("exec", "-n", ns, "target", "-c", "postgres", "--as", operator_identity,
                       "--", "true", check=False, timeout=60)  # fmt: skip
    assert "forbidden" not in res.stderr.lower(), res.stderr
    # The same exec as an identity without the role is refused, so the check above can fail.
    nobody = f"system:serviceaccount:{ns}:nobody"
    res = kube.kubectl("exec", "-n", ns, "target", "-c", "postgres", "--as", nobody,
                       "--", "true", check=False, timeout=60)  # fmt: skip
    assert "forbidden" in res.stderr.lower(), res.stderr
