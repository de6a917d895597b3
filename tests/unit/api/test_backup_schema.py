"""spec.backup and spec.bootstrap.recovery in the PostgresCluster model and its CRD: parsed, refused with the
field named, the root rule and the owned parameters in the generated schema."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.backup import ROOT_BACKUP_RULES
from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster
from pg_operator.api.crd import build
from pg_operator.api.manifests import rendered_files
from pg_operator.api.postgresql import OPERATOR_OWNED_PARAMETERS
from pg_operator.backup.archiving import ARCHIVING_PARAMETERS
from pg_operator.backup.barman import ObjectStore

S3: dict[str, Any] = {"bucket": "backups", "path": "prod", "endpointURL": "http://minio:9000",
                      "credentials": {"secretName": "s3-creds"}}  # fmt: skip


def obj(name: str = "orders-db", **spec: Any) -> dict[str, Any]:
    base = {"replicas": 1, "version": "16", "storage": "1Gi"}
    return {"metadata": {"name": name, "namespace": "shop", "uid": "u1"}, "spec": base | spec}


def refused(o: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(o)
    return str(info.value)


def test_backup_and_recovery_are_parsed() -> None:
    recovery = {"source": {"clusterName": "orders-db", "s3": S3}, "targetTime": "2026-12-01T08:30:00Z"}
    c = PostgresCluster.from_obj(obj("orders-restored", backup={"s3": S3}, bootstrap={"recovery": recovery}))
    assert c.spec.backup is not None and c.spec.backup.s3.bucket == "backups"
    assert c.spec.backup.archive_timeout == "60s" and c.spec.backup.wal_max_keep_size == "10GB"
    r = c.spec.bootstrap.recovery
    assert r is not None and r.source.cluster_name == "orders-db" and r.target_time == "2026-12-01T08:30:00Z"
    # initdb keeps its defaults: they name the application database and owner after the restore too.
    assert (c.spec.bootstrap.initdb.database, c.spec.bootstrap.initdb.owner) == ("app", "app")


def test_no_backup_by_default() -> None:
    c = PostgresCluster.from_obj(obj())
    assert c.spec.backup is None and c.spec.bootstrap.recovery is None


def test_a_restore_into_its_own_source_path_is_refused() -> None:
    recovery = {"source": {"clusterName": "orders-db", "s3": S3}}
    msg = refused(obj("orders-db", backup={"s3": S3}, bootstrap={"recovery": recovery}))
    assert msg.startswith("spec.bootstrap.recovery:") and "source's path" in msg
    # Another name, path or bucket is fine; so is a restore without an archive of its own.
    PostgresCluster.from_obj(obj("orders-db", backup={"s3": {**S3, "path": "other"}},
                                 bootstrap={"recovery": recovery}))  # fmt: skip
    PostgresCluster.from_obj(obj("orders-db", bootstrap={"recovery": recovery}))


SOURCE = {"clusterName": "a", "s3": S3}
NO_CREDENTIALS = {k: v for k, v in S3.items() if k != "credentials"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"backup": {"s3": {**S3, "bucket": "Bad_Bucket"}}}, "spec.backup.s3.bucket"),
        ({"backup": {"s3": S3, "compression": "xz"}}, "spec.backup.compression"),
        ({"backup": {"s3": S3, "archiveTimeout": "1h"}}, "spec.backup.archiveTimeout"),
        ({"backup": {"s3": S3, "retention": {"keepLast": 1, "recoveryWindow": "7d"}}},
         "spec.backup.retention"),
        ({"backup": {"s3": NO_CREDENTIALS}}, "spec.backup.s3.credentials"),
        ({"bootstrap": {"recovery": {"source": SOURCE, "targetTime": "2026-12-01 08:30"}}},
         "spec.bootstrap.recovery.targetTime"),
        ({"bootstrap": {"recovery": {"source": SOURCE, "targetLSN": "0/1",
                                     "targetTime": "2026-12-01T08:30:00Z"}}}, "spec.bootstrap.recovery"),
        ({"bootstrap": {"recovery": {"source": {"s3": S3}}}}, "spec.bootstrap.recovery.source.clusterName"),
    ],
)  # fmt: skip
def test_bad_backup_input_names_the_field(spec: dict[str, Any], field: str) -> None:
    assert field in refused(obj(**spec))


@pytest.mark.parametrize("parameter", ARCHIVING_PARAMETERS)
def test_archiving_parameters_are_operator_owned(parameter: str) -> None:
    assert parameter in OPERATOR_OWNED_PARAMETERS
    msg = refused(obj(postgresql={"parameters": {parameter: "1"}}))
    assert "spec.postgresql.parameters" in msg and parameter in msg and "set by the operator" in msg


def test_crd_carries_backup_recovery_and_the_root_rules() -> None:
    schema = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    assert spec["backup"]["required"] == ["s3"] and "default" not in spec["backup"]
    assert "recovery" in spec["bootstrap"]["properties"]
    assert "default" not in spec["bootstrap"]["properties"]["recovery"]
    rules = schema["x-kubernetes-validations"]
    assert all(rule in rules for rule in ROOT_BACKUP_RULES)
    parameter_rules = spec["postgresql"]["properties"]["parameters"]["x-kubernetes-validations"]
    for parameter in ARCHIVING_PARAMETERS:
        assert any(r["rule"] == f"!('{parameter}' in self)" for r in parameter_rules), parameter


def test_the_manifests_command_writes_every_crd() -> None:
    files = rendered_files()
    assert set(files) == {"postgresclusters.yaml", "backups.yaml", "scheduledbackups.yaml"}
    assert all("python -m pg_operator.api.manifests" in text.splitlines()[0] for text in files.values())
    # Each header names the module the kind's models are in.
    assert files["postgresclusters.yaml"].startswith("# Generated from src/pg_operator/api/cluster.py ")
    assert files["backups.yaml"].startswith("# Generated from src/pg_operator/api/backup.py ")


# --- admission and the operator agree: what spec.backup admits, ObjectStore accepts -----------------------

ENDPOINTS = ["http://minio:9000", "https://s3.eu-west-1.example.com", "https://h:443/base/path?x=1", "http://h/",
             "http://minio:9000\t", "http://minio:9000\n", "http://mi nio", "http://\x7fh", "minio:9000",
             "ftp://h", "http:///x", "http://é.example", "http://h/pä th"]  # fmt: skip
BUCKETS = ["backups", "my.bucket-1", "a.-b", "a..b", "a.", "-ab", "ab-", "Bad_Bucket", "ab", "b" * 64,
           "backups\n"]  # fmt: skip


def _admitted(s3: dict[str, Any]) -> bool:
    try:
        PostgresCluster.from_obj(obj(backup={"s3": s3}))
    except ValueError:
        return False
    return True


def _accepted(**store: Any) -> bool:
    try:
        ObjectStore(**{"bucket": "backups", "server_name": "orders-db"} | store)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_operator_accepts_exactly_the_endpoints_admission_admits(endpoint: str) -> None:
    assert _admitted({**S3, "endpointURL": endpoint}) == _accepted(endpoint_url=endpoint)


def test_endpoints_with_whitespace_or_control_characters_are_refused() -> None:
    assert _admitted(S3) and _accepted(endpoint_url=S3["endpointURL"])
    for endpoint in ("http://minio:9000\t", "http://minio:9000\n", "http://mi nio"):
        assert "spec.backup.s3.endpointURL" in refused(obj(backup={"s3": {**S3, "endpointURL": endpoint}}))


@pytest.mark.parametrize("bucket", BUCKETS)
def test_the_operator_accepts_exactly_the_buckets_admission_admits(bucket: str) -> None:
    assert _admitted({**S3, "bucket": bucket}) == _accepted(bucket=bucket)


@pytest.mark.parametrize("key", [".", "..", "..x"])
def test_secret_keys_the_pod_would_refuse_are_refused(key: str) -> None:
    credentials = {"secretName": "s3-creds", "accessKeyIDKey": key}
    assert "spec.backup.s3.credentials.accessKeyIDKey" in refused(
        obj(backup={"s3": {**S3, "credentials": credentials}})
    )


def test_secret_keys_with_dots_stay_admitted() -> None:
    credentials = {"secretName": "s3-creds", "accessKeyIDKey": ".id", "secretAccessKeyKey": "aws.secret..key"}
    PostgresCluster.from_obj(obj(backup={"s3": {**S3, "credentials": credentials}}))
