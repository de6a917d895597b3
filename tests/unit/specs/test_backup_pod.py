"""Backups in the pure builders: the StatefulSet's env and template annotation, instance.yaml's `backup`
section, and the Patroni config the entrypoint renders from it (archiving, and a restore instead of
initdb). Plain dicts in and out."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from harness.objects import cluster_model
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.backup.barman import DEFAULT_BIN_DIR
from pg_operator.instance import patroni_config as pc
from pg_operator.instance.inputs import DEFAULT_BARMAN_BIN_DIR, Credentials, pod_environment, tls_files
from pg_operator.specs.configmap import configmap
from pg_operator.specs.statefulset import BACKUP_CONFIG_ANNOTATION, statefulset

S3: dict[str, Any] = {"bucket": "backups", "path": "prod", "endpointURL": "http://minio.storage:9000",
                      "region": "eu-west-1", "credentials": {"secretName": "s3-creds"}}  # fmt: skip
SOURCE_S3: dict[str, Any] = {**S3, "credentials": {"secretName": "old-creds", "sessionTokenKey": "TOKEN"}}
RECOVERY = {"source": {"clusterName": "orders-db", "s3": SOURCE_S3},
            "targetTime": "2026-12-01T09:30:00+01:00"}  # fmt: skip
ENV = {"PGOP_CLUSTER_NAME": "orders-new", "PGOP_NAMESPACE": "shop", "PGOP_POD_NAME": "orders-new-0",
       "PGOP_POD_IP": "10.244.0.7", "PGOP_PG_MAJOR": "16",
       "PGDATA": "/var/lib/postgresql/data/pgdata"}  # fmt: skip
SECRET_VALUES = ("su-pw", "repl-pw", "app-pw", "api-pw")
CREDS = {
    role: Credentials(user, pw)
    for role, user, pw in zip(("superuser", "replication", "app", "patroni-api"),
                              ("postgres", "replicator", "app", "patroni"), SECRET_VALUES, strict=True)
}  # fmt: skip


def cluster(name: str = "orders-new", **spec: Any) -> PostgresCluster:
    return cluster_model(name, replicas=2, storage="1Gi", uid="u1", **spec)


def env_of(c: PostgresCluster) -> dict[str, Any]:
    (container,) = statefulset(c)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def instance_yaml(c: PostgresCluster) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(configmap(c)["data"]["instance.yaml"])
    return data


def rendered(c: PostgresCluster) -> dict[str, Any]:
    # The entrypoint's path: instance.yaml text → InstanceConfig → mapping → Patroni config.
    settings = InstanceConfig.from_yaml(configmap(c)["data"]["instance.yaml"])
    return pc.render_patroni_config(
        pod=pod_environment({**ENV, "PGOP_CLUSTER_NAME": c.name}),
        instance=settings.model_dump(by_alias=True, mode="json"),
        credentials=CREDS,
        os_user="postgres",
        post_bootstrap="python -m pg_operator.instance post-bootstrap",
        tls=tls_files("/var/run/postgresql"),
    )


def test_barman_bin_dirs_agree() -> None:
    assert DEFAULT_BARMAN_BIN_DIR == DEFAULT_BIN_DIR == pod_environment(ENV).barman_bin_dir


# --- StatefulSet --------------------------------------------------------------------------------------------


def test_no_backup_no_barman_env_and_no_annotation() -> None:
    c = cluster()
    assert not [n for n in env_of(c) if n.startswith(("AWS_", "PGOP_SOURCE_"))]
    assert BACKUP_CONFIG_ANNOTATION not in statefulset(c)["spec"]["template"]["metadata"]["annotations"]


def test_own_archive_credentials_by_secret_key_ref() -> None:
    env = env_of(cluster(backup={"s3": S3}))
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-creds", "key": "ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "s3-creds", "key": "ACCESS_SECRET_KEY"}}
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["AWS_REQUEST_CHECKSUM_CALCULATION"] == "when_required"
    assert "AWS_SESSION_TOKEN" not in env and not [n for n in env if n.startswith("PGOP_SOURCE_")]
    # The pod contract's own variables are still there, first.
    assert env["PGDATA"] == "/var/lib/postgresql/data/pgdata" and env["PGOP_CLUSTER_NAME"] == "orders-new"


def test_restore_source_credentials_are_prefixed_and_optional() -> None:
    env = env_of(cluster(backup={"s3": S3}, bootstrap={"recovery": RECOVERY}))
    assert env["PGOP_SOURCE_AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "old-creds", "key": "ACCESS_KEY_ID", "optional": True}
    }
    assert env["PGOP_SOURCE_AWS_SESSION_TOKEN"] == {
        "secretKeyRef": {"name": "old-creds", "key": "TOKEN", "optional": True}
    }
    assert env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "s3-creds"
    assert "optional" not in env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]


def test_restore_without_own_archive_still_gets_the_checksum_settings() -> None:
    env = env_of(cluster(bootstrap={"recovery": RECOVERY}))
    assert "AWS_ACCESS_KEY_ID" not in env and "PGOP_SOURCE_AWS_SECRET_ACCESS_KEY" in env
    assert env["AWS_RESPONSE_CHECKSUM_VALIDATION"] == "when_required"


def test_no_value_in_the_env_comes_from_a_secret() -> None:
    for name, value in env_of(cluster(backup={"s3": S3}, bootstrap={"recovery": RECOVERY})).items():
        if "KEY" in name or "TOKEN" in name:
            assert isinstance(value, dict) and "secretKeyRef" in value, name


def test_a_changed_store_changes_the_pod_template() -> None:
    def annotation(s3: dict[str, Any]) -> str:
        c = cluster(backup={"s3": s3})
        annotations = statefulset(c)["spec"]["template"]["metadata"]["annotations"]
        value: str = annotations[BACKUP_CONFIG_ANNOTATION]
        return value

    assert annotation(S3) == annotation(dict(S3))
    assert annotation(S3) != annotation({**S3, "bucket": "elsewhere"})


# --- ConfigMap ----------------------------------------------------------------------------------------------


def test_instance_yaml_without_backup_has_no_backup_key() -> None:
    assert "backup" not in instance_yaml(cluster())


def test_instance_yaml_backup_section() -> None:
    section = instance_yaml(cluster(backup={"s3": S3, "archiveTimeout": "5min", "compression": "snappy"}))
    assert section["backup"] == {
        "archive": {
            "store": {"bucket": "backups", "serverName": "orders-new", "path": "prod",
                      "endpointURL": "http://minio.storage:9000", "region": "eu-west-1",
                      "compression": "snappy"},
            "archiveTimeout": "5min",
            "walMaxKeepSize": "10GB",
        }
    }  # fmt: skip


def test_instance_yaml_recovery_section_holds_no_credentials() -> None:
    c = cluster(backup={"s3": S3}, bootstrap={"recovery": RECOVERY})
    text = configmap(c)["data"]["instance.yaml"]
    recovery = yaml.safe_load(text)["backup"]["recovery"]
    assert recovery["source"]["serverName"] == "orders-db"
    assert recovery["targetTime"] == "2026-12-01T09:30:00+01:00" and recovery["sessionToken"] is True
    assert "s3-creds" not in text and "old-creds" not in text and "ACCESS" not in text


def test_a_bad_backup_section_is_refused() -> None:
    base = instance_yaml(cluster(backup={"s3": S3}))
    # Its shape by the model both ends share; its contents when the entrypoint applies it.
    with pytest.raises(ValueError, match="unknown keys extra"):
        InstanceConfig.model_validate({**base, "backup": {"extra": {}}})
    with pytest.raises(ValueError, match=r"backup\.archive: expected a mapping"):
        InstanceConfig.model_validate({**base, "backup": {"archive": "nope"}})
    settings = InstanceConfig.model_validate({**base, "backup": {"archive": {"store": "nope"}}})
    with pytest.raises(ValueError, match=r"instance\.yaml: backup\.store: required mapping"):
        pc.render_patroni_config(
            pod=pod_environment(ENV), instance=settings.model_dump(by_alias=True, mode="json"),
            credentials=CREDS, os_user="postgres", post_bootstrap="pb", tls=tls_files("/run"),
        )  # fmt: skip
    bad_bucket = {"store": {**base["backup"]["archive"]["store"], "bucket": "Bad_Bucket"}}
    settings = InstanceConfig.model_validate({**base, "backup": {"archive": bad_bucket}})
    with pytest.raises(ValueError, match=r"backup\.s3\.bucket"):
        pc.render_patroni_config(
            pod=pod_environment(ENV), instance=settings.model_dump(by_alias=True, mode="json"),
            credentials=CREDS, os_user="postgres", post_bootstrap="pb", tls=tls_files("/run"),
        )  # fmt: skip


# --- the Patroni config -------------------------------------------------------------------------------------


def test_archiving_in_the_rendered_patroni_config() -> None:
    config = rendered(cluster(backup={"s3": S3, "archiveTimeout": "30s", "walMaxKeepSize": "2GB"}))
    params = config["postgresql"]["parameters"]
    assert params["archive_mode"] == "on" and params["archive_timeout"] == "30s"
    assert params["max_slot_wal_keep_size"] == "2GB"
    # barman-cloud-wal-archive runs behind the operator's gate (backup.archive_gate): the argv after exec.
    archive = shlex.split(params["archive_command"].split(") exec ", 1)[1].split(" ;; ", 1)[0])
    assert archive[0] == "/opt/pg-operator/bin/barman-cloud-wal-archive"
    assert archive[-3:] == ["s3://backups/prod", "orders-new", "%p"] and "--gzip" in archive
    assert archive[3:5] == ["--endpoint-url", "http://minio.storage:9000"]
    restore = shlex.split(config["postgresql"]["recovery_conf"]["restore_command"])
    assert restore[0].endswith("/barman-cloud-wal-restore") and restore[-4:] == [
        "s3://backups/prod", "orders-new", "%f", "%p"]  # fmt: skip
    # Still a new cluster: initdb, then post_bootstrap; the rest of the config is untouched.
    assert "initdb" in config["bootstrap"] and "method" not in config["bootstrap"]
    assert params["wal_log_hints"] == "on"
    assert config["bootstrap"]["post_bootstrap"].endswith("post-bootstrap")


def test_no_backup_section_renders_no_archiving() -> None:
    config = rendered(cluster())
    assert "archive_mode" not in config["postgresql"]["parameters"]
    assert "recovery_conf" not in config["postgresql"]


def test_recovery_replaces_initdb_in_the_rendered_patroni_config() -> None:
    config = rendered(cluster(backup={"s3": {**S3, "path": "new"}}, bootstrap={"recovery": RECOVERY}))
    bootstrap = config["bootstrap"]
    assert "initdb" not in bootstrap and bootstrap["method"] == "pgop_restore"
    assert bootstrap["post_bootstrap"].endswith("post-bootstrap")
    method = bootstrap["pgop_restore"]
    argv = shlex.split(method["command"])
    assert argv[:2] == ["/bin/sh", "-c"]
    script = argv[2]
    # Own archive checked first (empty), then the source restored with the source's credentials.
    assert script.index("barman-cloud-check-wal-archive") < script.index("barman-cloud-restore")
    assert 'AWS_ACCESS_KEY_ID="$PGOP_SOURCE_AWS_ACCESS_KEY_ID"' in script
    assert 'AWS_SESSION_TOKEN="$PGOP_SOURCE_AWS_SESSION_TOKEN"' in script
    assert "s3://backups/prod orders-db auto /var/lib/postgresql/data/pgdata" in script
    assert "s3://backups/new orders-new" in script
    recovery_conf = method["recovery_conf"]
    assert recovery_conf["recovery_target_time"] == "2026-12-01 08:30:00.000000+00"
    assert recovery_conf["recovery_target_action"] == "promote"
    assert "orders-db" in recovery_conf["restore_command"]
    # The cluster's own archive is configured for after the promotion.
    assert "s3://backups/new orders-new %p" in config["postgresql"]["parameters"]["archive_command"]


def test_rendered_config_holds_no_s3_secret() -> None:
    text = yaml.safe_dump(rendered(cluster(backup={"s3": S3}, bootstrap={"recovery": {**RECOVERY,
                                   "source": {"clusterName": "other", "s3": SOURCE_S3}}})))  # fmt: skip
    assert "s3-creds" not in text and "old-creds" not in text
    redacted = yaml.safe_dump(pc.redacted(yaml.safe_load(text)))
    assert not [v for v in SECRET_VALUES if v in redacted]
