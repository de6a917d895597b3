"""The import Job (specs/import_job.py): argv with no tenant value in it, connections by environment,
the source password and the target credentials by secretKeyRef, the restricted pod level."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from harness.objects import cluster_model
from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs.import_job import DUMP_SCRIPT, RESTORE_SCRIPT, import_job, job_name

HOSTILE_HOST = "evil.example.com"


def cluster(**imp: Any) -> PostgresCluster:
    spec = {"source": {"host": HOSTILE_HOST, "port": 6432, "user": "Reader$1",
                       "passwordSecret": {"name": "old-db-reader", "key": "pw"}, "sslMode": "require"},
            "databases": ["Shop-Db"], **imp}  # fmt: skip
    return cluster_model(version="17", bootstrap={"import": spec})


def containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod["initContainers"], *pod["containers"]]}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_owned_named_and_run_once() -> None:
    job = import_job(cluster())
    meta = job["metadata"]
    assert (job["apiVersion"], job["kind"], meta["name"]) == ("batch/v1", "Job", "orders-db-import")
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"]["db.example.com/cluster"] == "orders-db"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "Never"
    # Its pod is not an instance: the instance views select pods by the cluster label.
    assert "db.example.com/cluster" not in pod["metadata"]["labels"]
    assert job_name(cluster()) == "orders-db-import"


def test_argv_holds_only_constants_and_the_worker_count() -> None:
    job = import_job(cluster(jobs=3))
    dump, restore = containers(job)["dump"], containers(job)["restore"]
    assert dump["command"] == ["sh", "-c", DUMP_SCRIPT, "pgop-import-dump", "--jobs=3"]
    assert restore["command"] == ["sh", "-c", RESTORE_SCRIPT, "pgop-import-restore", "--jobs=3", "--no-owner",
                                  "--no-privileges", "--clean", "--if-exists", "--exit-on-error"]  # fmt: skip
    for c in (dump, restore):
        text = " ".join(c["command"])
        for value in (HOSTILE_HOST, "Reader$1", "Shop-Db", "old-db-reader", "6432"):
            assert value not in text


def test_source_connection_by_environment_and_password_by_secret_ref() -> None:
    got = env(containers(import_job(cluster()))["dump"])
    assert (got["PGHOST"], got["PGPORT"], got["PGUSER"], got["PGDATABASE"], got["PGSSLMODE"]) == (
        HOSTILE_HOST, "6432", "Reader$1", "Shop-Db", "require")  # fmt: skip
    assert got["PGPASSWORD"] == {"secretKeyRef": {"name": "old-db-reader", "key": "pw"}}
    assert "PGSSLROOTCERT" not in got


def test_target_is_the_app_database_as_the_app_role_with_verified_tls() -> None:
    got = env(containers(import_job(cluster()))["restore"])
    assert got["PGHOST"] == "orders-db-rw.shop.svc" and got["PGDATABASE"] == "app"
    assert got["PGUSER"] == {"secretKeyRef": {"name": "orders-db-app", "key": "username"}}
    assert got["PGPASSWORD"] == {"secretKeyRef": {"name": "orders-db-app", "key": "password"}}
    assert got["PGSSLMODE"] == "verify-full"
    volumes = {v["name"]: v for v in import_job(cluster())["spec"]["template"]["spec"]["volumes"]}
    # Only the app Secret's CA certificate is mounted, never its password as a file.
    assert volumes["target-ca"]["secret"] == {"secretName": "orders-db-app",
                                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}  # fmt: skip


@pytest.mark.parametrize(("ca", "source"), [({"secretName": "old-ca", "key": "root.pem"}, "secret"),
                                            ({"configMapName": "old-ca"}, "configMap")])  # fmt: skip
def test_source_ca_from_one_key(ca: dict[str, str], source: str) -> None:
    job = import_job(cluster(source={"host": "db", "user": "r", "passwordSecret": {"name": "p"},
                                     "sslMode": "verify-full", "ca": ca}))  # fmt: skip
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["source-ca"][source]["items"] == [{"key": ca.get("key", "ca.crt"), "path": "ca.crt"}]
    got = env(containers(job)["dump"])
    assert got["PGSSLROOTCERT"] == "/etc/pg-operator/import/source-ca/ca.crt"


def test_restricted_pod_security_and_no_token() -> None:
    pod = import_job(cluster())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in containers(import_job(cluster())).values():
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert c["image"] == "localhost/pg-operator/postgres:17.11"


def test_a_cluster_without_import_has_no_job() -> None:
    with pytest.raises(ValueError, match=r"no spec\.bootstrap\.import"):
        import_job(cluster_model())


def test_deterministic() -> None:
    assert import_job(cluster()) == import_job(cluster())


@pytest.mark.parametrize("script", [DUMP_SCRIPT, RESTORE_SCRIPT])
def test_the_scripts_parse(script: str) -> None:
    """The constant scripts are valid POSIX shell (a syntax error would surface only in a pod)."""
    result = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
