"""The backup schemas on the real API server (kwok profile): the Backup and ScheduledBackup CRDs, and the
PostgresCluster schema with `spec.backup`, `spec.bootstrap.recovery` and the root rule wired in the way
the API piece will wire them. The three are installed under throwaway kinds, so this test neither needs
nor disturbs the real CRDs, and removed at the end. Objects are only dry-run created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import Kube
from pg_operator.api.backup import (
    ROOT_BACKUP_RULES,
    BackupConfiguration,
    RecoveryBootstrap,
    backup_crd,
    scheduled_backup_crd,
)
from pg_operator.api.constants import GROUP
from pg_operator.api.crd import crd, structural_schema

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


def wired_cluster_crd() -> dict[str, Any]:
    """The PostgresCluster CRD plus the backup fields, as api/models.py will declare them."""
    definition = crd()
    schema = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    spec["backup"] = structural_schema(BackupConfiguration)
    spec["bootstrap"]["properties"]["recovery"] = structural_schema(RecoveryBootstrap)
    schema["x-kubernetes-validations"] = [*schema.get("x-kubernetes-validations", []), *ROOT_BACKUP_RULES]
    return renamed(definition, KINDS["PostgresCluster"])


@pytest.fixture(scope="module")
def crds(kube: Kube) -> Iterator[None]:
    definitions = [
        renamed(backup_crd(), KINDS["Backup"]),
        renamed(scheduled_backup_crd(), KINDS["ScheduledBackup"]),
        wired_cluster_crd(),
    ]
    names = [f"crd/{d['metadata']['name']}" for d in definitions]
    try:
        items = json.dumps({"apiVersion": "v1", "kind": "List", "items": definitions})
        kube.kubectl("apply", "--server-side", "-f", "-", input=items)
        kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
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
