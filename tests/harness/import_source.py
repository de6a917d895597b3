"""An external PostgreSQL server for the import's e2e test and benchmark: a plain pod the operator does
not manage (the project's postgres image run with a plain `postgres` command: initdb, password auth from
the pod network, no TLS), its Service, SQL on it, and the pieces of a cluster that imports from it."""

from __future__ import annotations

import base64
import json
from typing import Any

from harness.local_cluster import Kube
from pg_operator.images import default_image

SOURCE = "legacy-db"
READER = "reader"
BIN = "/usr/lib/postgresql/current/bin"
SOURCE_SCRIPT = (
    "set -e; D=/tmp/pgdata; "
    'echo "$SUPERPASS" > /tmp/pw; '
    # The local socket trusted (the test's own psql by exec), the network by password.
    f"{BIN}/initdb -D $D -U postgres --auth-local=trust --auth-host=scram-sha-256 --pwfile=/tmp/pw "
    ">/dev/null; "
    'echo "host all all 0.0.0.0/0 scram-sha-256" >> $D/pg_hba.conf; '
    f"exec {BIN}/postgres -D $D -c listen_addresses=* -c unix_socket_directories=/tmp"
)


SUPERUSER_PASSWORD = "source-super"  # a throwaway server's


def source_pod(ns: str, major: str = "15") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": SOURCE, "namespace": ns, "labels": {"app": SOURCE}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "postgres", "image": default_image(major), "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SOURCE_SCRIPT],
                "env": [{"name": "SUPERPASS", "value": SUPERUSER_PASSWORD}],
                "ports": [{"containerPort": 5432}],
                "readinessProbe": {"exec": {"command": [f"{BIN}/pg_isready", "-h", "/tmp"]},
                                   "periodSeconds": 2},
                "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


def service(ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SOURCE, "namespace": ns},
            "spec": {"selector": {"app": SOURCE}, "ports": [{"port": 5432, "targetPort": 5432}]}}  # fmt: skip


def start_source(kube: Kube, ns: str, reader_password: str, major: str = "15") -> None:
    """The source serving in `ns`, with a read-only login role READER (pg_read_all_data)."""
    listing = {"apiVersion": "v1", "kind": "List", "items": [source_pod(ns, major), service(ns)]}
    kube.kubectl("apply", "-f", "-", input=json.dumps(listing))
    kube.kubectl("-n", ns, "wait", f"pod/{SOURCE}", "--for=condition=Ready", "--timeout=300s", timeout=320)
    source_sql(kube, ns, f"CREATE ROLE {READER} LOGIN PASSWORD '{reader_password}' IN ROLE pg_read_all_data")


def source_sql(kube: Kube, ns: str, sql: str, database: str = "postgres", timeout: float = 60) -> str:
    psql = [f"{BIN}/psql", "-h", "/tmp", "-U", "postgres", "-d", database, "-AtX", "-v", "ON_ERROR_STOP=1"]
    res = kube.kubectl("exec", SOURCE, "-n", ns, "--", *psql, "-c", sql, timeout=timeout)
    return str(res.stdout).strip()


def password_secret(ns: str, name: str, password: str, cluster_name: str) -> dict[str, Any]:
    """A password Secret labelled for `cluster_name` (the import uses no other)."""
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns, "labels": {"db.example.com/cluster": cluster_name}},
            "data": {"password": base64.b64encode(password.encode()).decode()}}  # fmt: skip


def import_bootstrap(ns: str, secret_name: str, database: str, jobs: int = 1) -> dict[str, Any]:
    """spec.bootstrap for a cluster importing `database` from the source as READER (no TLS)."""
    return {"import": {
        "source": {"host": f"{SOURCE}.{ns}.svc", "user": READER, "sslMode": "disable",
                   "passwordSecret": {"name": secret_name}},
        "databases": [database], "jobs": jobs}}  # fmt: skip
