"""What the instance pods need for backups: environment variables for barman-cloud, taken from the
credentials Secret with `secretKeyRef`, so the values never pass through the operator, a ConfigMap, argv
or a log (PostgreSQL, hence archive_command / restore_command, and Patroni's bootstrap command inherit
the container's environment); and instance.yaml's `backup` section, the store and settings without
credentials.

The pods get a store only as the operator would call it itself (backup.store_policy): an https endpoint
unless the install allows plain HTTP, and credentials from a Secret labelled for the cluster.
Otherwise `spec.backup` is left out of the pods (no Secret reference, no endpoint), so a tenant cannot
have an instance send another Secret's values to a server of its choosing; the backup reconcilers
report the refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pg_operator.api.backup import BackupConfiguration, RecoveryBootstrap, S3Destination
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.backup.barman import (
    ACCESS_KEY_ENV,
    CHECKSUM_ENV,
    DEFAULT_BIN_DIR,
    REGION_ENV,
    SECRET_KEY_ENV,
    SESSION_TOKEN_ENV,
)
from pg_operator.backup.from_spec import archive_settings, recovery_source, recovery_target
from pg_operator.backup.instance_section import RecoveryPlan, section
from pg_operator.backup.recovery import SOURCE_ENV_PREFIX
from pg_operator.backup.store_policy import (
    BACKUP_CREDENTIALS_FIELD,
    BACKUP_ENDPOINT_FIELD,
    RECOVERY_CREDENTIALS_FIELD,
    RECOVERY_ENDPOINT_FIELD,
    Refusal,
    credential_refusal,
    endpoint_refusal,
)


def _store_refusals(cluster: PostgresCluster, s3: S3Destination, fields: tuple[str, str], *,
                    labelled: Callable[[str], bool], allow_insecure: bool) -> list[Refusal]:  # fmt: skip
    """Why a store of the spec may not be wired into the pods: plain HTTP unless allowed, a credentials
    Secret not known to carry the cluster's label (missing or not). `fields`: (endpoint, credentials)."""
    endpoint_field, credentials_field = fields
    refusals = []
    endpoint = endpoint_refusal(s3.endpoint_url, field=endpoint_field, allow_insecure=allow_insecure)
    if endpoint is not None:
        refusals.append(endpoint)
    secret = s3.credentials.secret_name
    labels = {CLUSTER_LABEL: cluster.name} if labelled(secret) else {}
    unlabelled = credential_refusal(labels, cluster=cluster.name, secret=secret, field=credentials_field)
    if unlabelled is not None:
        refusals.append(unlabelled)
    return refusals


def backup_refusals(
    cluster: PostgresCluster, *, labelled: Callable[[str], bool], allow_insecure: bool
) -> list[Refusal]:
    """Why `spec.backup` may not be wired into the pods. `labelled(name)`: the Secret carries the
    cluster's label."""
    backup = cluster.spec.backup
    if backup is None:
        return []
    return _store_refusals(cluster, backup.s3, (BACKUP_ENDPOINT_FIELD, BACKUP_CREDENTIALS_FIELD),
                           labelled=labelled, allow_insecure=allow_insecure)  # fmt: skip


def recovery_refusals(
    cluster: PostgresCluster, *, labelled: Callable[[str], bool], allow_insecure: bool
) -> list[Refusal]:
    """Why `spec.bootstrap.recovery`'s source store may not be wired into the pods: the same rules as
    `spec.backup`, the Secret labelled for this (the restored) cluster."""
    recovery = cluster.spec.bootstrap.recovery
    if recovery is None:
        return []
    return _store_refusals(cluster, recovery.source.s3, (RECOVERY_ENDPOINT_FIELD, RECOVERY_CREDENTIALS_FIELD),
                           labelled=labelled, allow_insecure=allow_insecure)  # fmt: skip


def wired_for_pods(
    cluster: PostgresCluster, *, labelled: Callable[[str], bool], allow_insecure: bool
) -> PostgresCluster:
    """The cluster the pods are built from: itself, or without `spec.backup` or the recovery source when
    that is refused (the caller holds back a new cluster's StatefulSet while its recovery source is
    refused: without it, the pods would initdb an empty database instead of restoring)."""
    update: dict[str, object] = {}
    if backup_refusals(cluster, labelled=labelled, allow_insecure=allow_insecure):
        update["backup"] = None
    if recovery_refusals(cluster, labelled=labelled, allow_insecure=allow_insecure):
        update["bootstrap"] = cluster.spec.bootstrap.model_copy(update={"recovery": None})
    if not update:
        return cluster
    return cluster.model_copy(update={"spec": cluster.spec.model_copy(update=update)})


def _secret_env(name: str, secret: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def barman_env(
    *,
    secret_name: str,
    access_key_id_key: str,
    secret_access_key_key: str,
    session_token_key: str | None = None,
    region: str | None = None,
    prefix: str = "",
    optional: bool = False,
) -> list[dict[str, Any]]:
    """EnvVar objects for the postgres container (sorted by name, so the pod template is stable).
    `prefix` (recovery.SOURCE_ENV_PREFIX) names the recovery source's set; the checksum settings are
    given once, unprefixed, by the caller's own set or `checksum_env()`. `optional`: the pod starts even
    when the Secret or key is missing (the variable is then unset)."""
    env = [
        _secret_env(prefix + ACCESS_KEY_ENV, secret_name, access_key_id_key, optional=optional),
        _secret_env(prefix + SECRET_KEY_ENV, secret_name, secret_access_key_key, optional=optional),
    ]
    if not prefix:
        env += checksum_env()
    if session_token_key:
        env.append(_secret_env(prefix + SESSION_TOKEN_ENV, secret_name, session_token_key, optional=optional))
    if region:
        env.append({"name": prefix + REGION_ENV, "value": region})
    return sorted(env, key=lambda e: str(e["name"]))


def checksum_env() -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in CHECKSUM_ENV.items()]


def pod_env(
    backup: BackupConfiguration | None, recovery: RecoveryBootstrap | None = None
) -> list[dict[str, Any]]:
    """The postgres container's barman-cloud environment: the cluster's own destination as AWS_*, a
    recovery source as PGOP_SOURCE_AWS_* (the restore commands map it back for their own process), all by
    secretKeyRef. The source's references are optional: the pod template keeps them for the cluster's
    life (bootstrap is immutable), and only the first bootstrap reads them, so deleting the source's
    Secret after the restore must not keep later pods from starting."""
    env: list[dict[str, Any]] = []
    sets = [(backup.s3, "") if backup is not None else None,
            (recovery.source.s3, SOURCE_ENV_PREFIX) if recovery is not None else None]  # fmt: skip
    for s3, prefix in filter(None, sets):
        c = s3.credentials
        env += barman_env(
            secret_name=c.secret_name,
            access_key_id_key=c.access_key_id_key,
            secret_access_key_key=c.secret_access_key_key,
            session_token_key=c.session_token_key,
            region=s3.region,
            prefix=prefix,
            optional=bool(prefix),
        )
    if backup is None and env:
        env += checksum_env()
    return sorted(env, key=lambda e: str(e["name"]))


def instance_backup_section(
    cluster_name: str,
    backup: BackupConfiguration | None,
    recovery: RecoveryBootstrap | None,
    *,
    bin_dir: str = DEFAULT_BIN_DIR,
) -> dict[str, Any] | None:
    """instance.yaml's `backup` value for a cluster (InstanceConfig.backup); None without either."""
    archive = archive_settings(backup, cluster_name, bin_dir=bin_dir) if backup is not None else None
    plan = None
    if recovery is not None:
        plan = RecoveryPlan(
            source=recovery_source(recovery, bin_dir=bin_dir),
            target=recovery_target(recovery),
            session_token=recovery.source.s3.credentials.session_token_key is not None,
        )
    return section(archive, plan)
