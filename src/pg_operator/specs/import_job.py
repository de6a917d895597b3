"""The Job that runs `spec.bootstrap.import` (docs/import.md): a pure builder, cluster spec → Job.

One pod, two steps, each its own container so the pod's container statuses tell the operator where the
import is without reading logs:

1. init container `dump`: pg_dump -Fd -j N of the source database into an emptyDir, then the number of
   entries of the dump's table of contents (pg_restore -l) as its termination message;
2. container `restore`: pg_restore -j N into the cluster's application database as the application role,
   over the `-rw` Service with TLS verified against the cluster's CA (the `-app` Secret's `ca.crt`).

Tenant values never enter a script: the two `sh -c` scripts are constants, and host, port, database and
role names reach libpq as environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER), the source's
password by secretKeyRef, so it passes through no argv, log or ConfigMap. The pod runs at the `restricted`
Pod Security level, without a service account token.
"""

from __future__ import annotations

from typing import Any

from pg_operator.api.bootstrap_import import ImportBootstrap
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import PG_PORT
from pg_operator.images import default_image, image_pull_secrets
from pg_operator.orchestration.bootstrap_import import DUMP_CONTAINER, OBJECTS_PREFIX, RESTORE_CONTAINER
from pg_operator.specs import names
from pg_operator.specs.labels import child_metadata
from pg_operator.specs.secrets import APP_CA_KEY

COMPONENT_IMPORT = "import"
PG_BIN_DIR = "/usr/lib/postgresql/current/bin"
POSTGRES_UID = 999
DUMP_DIR = "/import/dump"
SOURCE_CA_DIR = "/etc/pg-operator/import/source-ca"
TARGET_CA_DIR = "/etc/pg-operator/import/target-ca"

# Constant scripts: their arguments ("$@") are the fixed option list below; the connection comes from the
# environment. `set -e` with a pipeline: the count's failure does not hide the dump's.
DUMP_SCRIPT = (
    "set -e; "
    f'"{PG_BIN_DIR}/pg_dump" --no-password --format=directory --file={DUMP_DIR} "$@"; '
    f'n=$("{PG_BIN_DIR}/pg_restore" --list {DUMP_DIR} | grep -c -v "^;" || true); '
    f'echo "{OBJECTS_PREFIX}$n" >/dev/termination-log'
)
RESTORE_SCRIPT = f'exec "{PG_BIN_DIR}/pg_restore" --no-password "$@" --dbname="$PGDATABASE" {DUMP_DIR}'


def job_name(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-import"


def dump_args(spec: ImportBootstrap) -> list[str]:
    """pg_dump's options after the constant ones: parallel workers only (the connection is in the
    environment; owners and privileges are left out at the restore, an archive keeps them)."""
    return [f"--jobs={spec.jobs}"]


def restore_args(spec: ImportBootstrap) -> list[str]:
    """pg_restore's options: --clean --if-exists so a retried Job starts over on a partly restored
    database; --exit-on-error so a failure fails the Job instead of being counted and ignored."""
    return [f"--jobs={spec.jobs}", "--no-owner", "--no-privileges", "--clean", "--if-exists",
            "--exit-on-error"]  # fmt: skip


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def source_env(spec: ImportBootstrap) -> list[dict[str, Any]]:
    src = spec.source
    env = [
        _env("PGHOST", src.host),
        _env("PGPORT", str(src.port)),
        _env("PGUSER", src.user),
        _env("PGDATABASE", spec.databases[0]),
        _env("PGSSLMODE", src.ssl_mode),
        _env("PGAPPNAME", "pg-operator-import"),
        _env("PGCONNECT_TIMEOUT", "10"),
        _secret_env("PGPASSWORD", src.password_secret.name, src.password_secret.key),
    ]
    if src.ca is not None:
        env.append(_env("PGSSLROOTCERT", f"{SOURCE_CA_DIR}/ca.crt"))
    return env


def target_env(cluster: PostgresCluster) -> list[dict[str, Any]]:
    app = names.app_secret(cluster)
    return [
        _env("PGHOST", f"{names.rw_service(cluster)}.{cluster.namespace}.svc"),
        _env("PGPORT", str(PG_PORT)),
        _env("PGDATABASE", cluster.spec.bootstrap.initdb.database),
        _secret_env("PGUSER", app, "username"),
        _secret_env("PGPASSWORD", app, "password"),
        _env("PGSSLMODE", "verify-full"),
        _env("PGSSLROOTCERT", f"{TARGET_CA_DIR}/{APP_CA_KEY}"),
        _env("PGAPPNAME", "pg-operator-import"),
        _env("PGCONNECT_TIMEOUT", "10"),
    ]


_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": POSTGRES_UID,
    "runAsGroup": POSTGRES_UID,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _container(cluster: PostgresCluster, name: str, script: str, args: list[str],
               env: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    spec = cluster.spec
    return {
        "name": name,
        "image": spec.image or default_image(spec.version),
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["sh", "-c", script, f"pgop-import-{name}", *args],
        "env": env,
        "volumeMounts": [{"name": "dump", "mountPath": "/import"}, *mounts],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "securityContext": dict(_SECURITY),
        # A failed step's last log lines become its termination message: the reason the operator reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _source_ca_volume(spec: ImportBootstrap) -> list[dict[str, Any]]:
    ca = spec.source.ca
    if ca is None:
        return []
    items = [{"key": ca.key, "path": "ca.crt"}]
    if ca.secret_name is not None:
        return [{"name": "source-ca", "secret": {"secretName": ca.secret_name, "items": items}}]
    return [{"name": "source-ca", "configMap": {"name": ca.config_map_name, "items": items}}]


def import_job(cluster: PostgresCluster) -> dict[str, Any]:
    """The import Job of a cluster with `spec.bootstrap.import`. Created once (create-only): a Job's
    template is immutable. backoffLimit 0: a failure is reported, and deleting the Job runs another."""
    spec = cluster.spec.bootstrap.import_
    if spec is None:
        raise ValueError("import_job: the cluster has no spec.bootstrap.import")
    meta = child_metadata(cluster, job_name(cluster), COMPONENT_IMPORT)
    source_mounts = (
        [{"name": "source-ca", "mountPath": SOURCE_CA_DIR, "readOnly": True}] if spec.source.ca else []
    )
    dump = _container(cluster, DUMP_CONTAINER, DUMP_SCRIPT, dump_args(spec), source_env(spec), source_mounts)
    restore = _container(cluster, RESTORE_CONTAINER, RESTORE_SCRIPT, restore_args(spec), target_env(cluster),
                         [{"name": "target-ca", "mountPath": TARGET_CA_DIR, "readOnly": True}])  # fmt: skip
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POSTGRES_UID,
            "runAsGroup": POSTGRES_UID,
            "fsGroup": POSTGRES_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [dump],
        "containers": [restore],
        "volumes": [
            {"name": "dump", "emptyDir": {}},
            # Only the CA certificate of the cluster's app Secret, never its password as a file.
            {
                "name": "target-ca",
                "secret": {
                    "secretName": names.app_secret(cluster),
                    "items": [{"key": APP_CA_KEY, "path": APP_CA_KEY}],
                },
            },
            *_source_ca_volume(spec),
        ],
    }
    pull_secrets = image_pull_secrets()
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets
    # The pod does not carry the cluster's label: it is not an instance (the instance views select by it).
    pod_labels = {
        "app.kubernetes.io/name": "postgresql-import",
        "app.kubernetes.io/instance": cluster.name,
        "app.kubernetes.io/component": COMPONENT_IMPORT,
        "app.kubernetes.io/managed-by": "pg-operator",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
