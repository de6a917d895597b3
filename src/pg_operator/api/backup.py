"""Typed models of backups: a cluster's `spec.backup` and `spec.bootstrap.recovery`, and the `Backup` and
`ScheduledBackup` kinds, with their CRDs.

As in `api/cluster.py`, each constraint is written once and lands twice: in the CRD (pattern, enum or CEL,
so the API server refuses bad input) and in pydantic validation (an error naming the field if the schema
was bypassed). The values come from `pg_operator.backup`, which turns them into barman-cloud commands.
The CRDs are generated with the structural-schema converter of `api/crd.py`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from pg_operator.api.constants import GROUP, VERSION
from pg_operator.backup import cron
from pg_operator.backup.archiving import (
    ARCHIVE_TIMEOUT_PATTERN,
    DEFAULT_ARCHIVE_TIMEOUT,
    DEFAULT_WAL_MAX_KEEP_SIZE,
    WAL_SIZE_PATTERN,
    ArchiveSettings,
)
from pg_operator.backup.barman import (
    BACKUP_ID_PATTERN,
    BUCKET_PATTERN,
    COMPRESSIONS,
    DEFAULT_BIN_DIR,
    PATH_PATTERN,
    RESERVED_BACKUP_NAMES,
    SERVER_NAME_PATTERN,
    Compression,
    ObjectStore,
)
from pg_operator.backup.recovery import LSN_PATTERN, RFC3339_PATTERN, RecoveryTarget, parse_rfc3339
from pg_operator.backup.recovery import recovery_conflict as recovery_conflict_of_stores
from pg_operator.backup.retention import MAX_KEEP_LAST, RECOVERY_WINDOW_PATTERN, RetentionPolicy

# Same limits as the cluster's name (api/cluster.py): a backup names a cluster.
MAX_CLUSTER_NAME_LENGTH = 50
SECRET_NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # noqa: S105 (a pattern)
SECRET_KEY_PATTERN = "^[-._a-zA-Z0-9]+$"  # noqa: S105 (a pattern)
ENDPOINT_PATTERN = "^https?://[^/ ]+(/[^ ]*)?$"
REGION_PATTERN = "^[a-z0-9][-a-z0-9]{0,31}$"


def _rule(rule: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": rule, "message": message, **extra}


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class _Model(BaseModel):
    # camelCase on the wire; unknown fields are an error (the API server prunes them first).
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class _StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


# --- spec.backup ----------------------------------------------------------------------------------------


class S3Credentials(_Model):
    """A Secret in the cluster's namespace; its values reach barman-cloud as environment variables only."""

    secret_name: str = Field(max_length=253, pattern=SECRET_NAME_PATTERN, description="Secret name.")
    access_key_id_key: str = Field(
        "ACCESS_KEY_ID", alias="accessKeyIDKey", max_length=253, pattern=SECRET_KEY_PATTERN,
        description="Key of the access key ID in the Secret.",
    )  # fmt: skip
    secret_access_key_key: str = Field(
        "ACCESS_SECRET_KEY", max_length=253, pattern=SECRET_KEY_PATTERN,
        description="Key of the secret access key in the Secret.",
    )  # fmt: skip
    session_token_key: str | None = Field(
        None, max_length=253, pattern=SECRET_KEY_PATTERN,
        description="Key of a session token in the Secret (temporary credentials), if any.",
    )  # fmt: skip


class S3Destination(_Model):
    endpoint_url: str | None = Field(
        None, alias="endpointURL", max_length=512, pattern=ENDPOINT_PATTERN,
        description="S3-compatible endpoint (http or https); AWS S3 itself when unset.",
    )  # fmt: skip
    bucket: str = Field(min_length=3, max_length=63, pattern=BUCKET_PATTERN, description="Bucket name.")
    path: str = Field(
        "", max_length=512, pattern=PATH_PATTERN,
        description="Key prefix inside the bucket; the cluster's objects go under <path>/<cluster name>/.",
    )  # fmt: skip
    region: str = Field(
        "us-east-1", max_length=32, pattern=REGION_PATTERN, description="Region of the bucket."
    )
    credentials: S3Credentials = Field(description="Where the access keys are.")

    def object_store(
        self, server_name: str, *, compression: Compression = "gzip", bin_dir: str = DEFAULT_BIN_DIR
    ) -> ObjectStore:
        return ObjectStore(
            bucket=self.bucket,
            server_name=server_name,
            path=self.path,
            endpoint_url=self.endpoint_url,
            region=self.region,
            compression=compression,
            bin_dir=bin_dir,
        )


class Retention(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _rule(
                "has(self.recoveryWindow) != has(self.keepLast)",
                "backup.retention: set exactly one of recoveryWindow (e.g. 7d, 4w, 3m) and keepLast",
            )
        )
    )

    recovery_window: str | None = Field(
        None, max_length=5, pattern=RECOVERY_WINDOW_PATTERN,
        description="Keep what any point in this window needs: days, weeks or months, e.g. 7d, 4w, 3m.",
    )  # fmt: skip
    keep_last: int | None = Field(
        None, ge=1, le=MAX_KEEP_LAST, description="Keep this many newest completed base backups."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Retention:
        self.policy()
        return self

    def policy(self) -> RetentionPolicy:
        try:
            return RetentionPolicy(recovery_window=self.recovery_window, keep_last=self.keep_last)
        except ValueError as e:
            raise ValueError(f"backup.{e}") from None


class BackupConfiguration(_Model):
    """Continuous WAL archiving and base backups of one cluster to an S3-compatible store."""

    s3: S3Destination = Field(description="Where the backups and WAL go.")
    retention: Retention | None = Field(
        None, description="Which base backups (and the WAL they need) to delete; none by default."
    )
    compression: Literal["gzip", "bzip2", "snappy", "none"] = Field(
        "gzip", description="Compression of WAL segments and base backups."
    )
    archive_timeout: str = Field(
        DEFAULT_ARCHIVE_TIMEOUT, max_length=8, pattern=ARCHIVE_TIMEOUT_PATTERN,
        description="Longest a written transaction waits to be archived (bounds the RPO), e.g. 60s, 5min.",
    )  # fmt: skip
    wal_max_keep_size: str = Field(
        DEFAULT_WAL_MAX_KEEP_SIZE, max_length=12, pattern=WAL_SIZE_PATTERN,
        description=(
            "Most WAL a replication slot may hold back (max_slot_wal_keep_size), e.g. 10GB. WAL waiting "
            "to be archived is kept regardless; the ContinuousArchiving condition reports that."
        ),
    )  # fmt: skip
    on_delete: Literal["keep", "delete"] = Field(
        "keep", description="What happens to the bucket's objects when the cluster is deleted."
    )

    def archive_settings(self, cluster_name: str, *, bin_dir: str = DEFAULT_BIN_DIR) -> ArchiveSettings:
        return ArchiveSettings(
            store=self.s3.object_store(cluster_name, compression=self.compression, bin_dir=bin_dir),
            archive_timeout=self.archive_timeout,
            wal_max_keep_size=self.wal_max_keep_size,
        )


# --- spec.bootstrap.recovery ----------------------------------------------------------------------------


class RecoverySource(_Model):
    cluster_name: str = Field(
        max_length=MAX_CLUSTER_NAME_LENGTH, pattern=SERVER_NAME_PATTERN,
        description="Name of the cluster whose backups are restored (its objects are under <path>/<name>/).",
    )  # fmt: skip
    s3: S3Destination = Field(description="Where that cluster's backups are.")


class RecoveryBootstrap(_Model):
    """A new cluster from another one's base backup and WAL, up to a point in time."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _rule(
                "!(has(self.targetTime) && has(self.targetLSN))",
                "bootstrap.recovery: set at most one of targetTime and targetLSN (neither: the latest point)",
            )
        )
    )

    source: RecoverySource = Field(description="The cluster and store to restore from.")
    target_time: str | None = Field(
        None, max_length=40, pattern=RFC3339_PATTERN,
        description="Recover up to this time, RFC 3339 with a zone (e.g. 2026-12-01T08:30:00Z).",
        # `format` makes the API server check that the date exists (the pattern checks the shape).
        json_schema_extra={"format": "date-time"},
    )  # fmt: skip
    target_lsn: str | None = Field(
        None, alias="targetLSN", max_length=17, pattern=LSN_PATTERN, description="Recover up to this LSN."
    )
    backup_id: str | None = Field(
        None, alias="backupID", max_length=15, pattern=BACKUP_ID_PATTERN,
        description="Base backup to start from; by default the newest one that ends before the target.",
    )  # fmt: skip

    @field_validator("target_time")
    @classmethod
    def _real_time(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rfc3339(value)
        return value

    @model_validator(mode="after")
    def _one_target(self) -> RecoveryBootstrap:
        if self.target_time is not None and self.target_lsn is not None:
            raise ValueError(
                "bootstrap.recovery: set at most one of targetTime and targetLSN (neither: the latest point)"
            )
        return self

    def target(self) -> RecoveryTarget:
        return RecoveryTarget(time=self.target_time, lsn=self.target_lsn, backup_id=self.backup_id)

    def source_store(self, *, bin_dir: str = DEFAULT_BIN_DIR) -> ObjectStore:
        # Compression is detected when reading; the value here is unused.
        return self.source.s3.object_store(self.source.cluster_name, bin_dir=bin_dir)


# Rule for the root of the PostgresCluster schema (it needs metadata.name, the cluster's barman server
# name): a restored cluster must not archive where its source does — same store, bucket, path and name.
# Another name, bucket or path is fine. `recovery_conflict` is the same test in Python.
def _endpoint(obj: str) -> str:
    return f"(has({obj}.endpointURL) ? {obj}.endpointURL : '')"


_SRC = "self.spec.bootstrap.recovery.source"
_OWN = "self.spec.backup.s3"
ROOT_BACKUP_RULES: tuple[dict[str, str], ...] = (
    _rule(
        "!has(self.spec.backup) || !has(self.spec.bootstrap) || !has(self.spec.bootstrap.recovery) || "
        f"{_SRC}.clusterName != self.metadata.name || {_SRC}.s3.bucket != {_OWN}.bucket || "
        f"{_SRC}.s3.path != {_OWN}.path || {_endpoint(_SRC + '.s3')} != {_endpoint(_OWN)}",
        "bootstrap.recovery: this cluster would archive into its source's path (same store, bucket, path "
        "and cluster name); use another name, bucket or path",
    ),
)


def recovery_conflict(
    cluster_name: str, backup: BackupConfiguration | None, recovery: RecoveryBootstrap
) -> str | None:
    """Why the cluster's own archive would be its recovery source's (None when it is not)."""
    own = backup.s3.object_store(cluster_name) if backup is not None else None
    return recovery_conflict_of_stores(recovery.source_store(), own)


# --- the Backup kind ------------------------------------------------------------------------------------

BACKUP_KIND = "Backup"
BACKUP_PLURAL = "backups"
SCHEDULED_BACKUP_KIND = "ScheduledBackup"
SCHEDULED_BACKUP_PLURAL = "scheduledbackups"
# Owner label of the Backups a ScheduledBackup creates (value: its name).
SCHEDULED_BACKUP_LABEL = f"{GROUP}/scheduled-backup"


class BackupSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _rule(
                "self == oldSelf",
                "a Backup's spec cannot change; create another Backup",
                reason="FieldValueForbidden",
            )
        )
    )

    cluster: str = Field(
        max_length=MAX_CLUSTER_NAME_LENGTH, pattern=SERVER_NAME_PATTERN,
        description="PostgresCluster (same namespace) to back up; it needs spec.backup.",
    )  # fmt: skip


BackupPhase = Literal["Pending", "Running", "Completed", "Failed"]


class BackupStatus(_StatusModel):
    phase: BackupPhase | None = Field(None, description="Pending, Running, Completed or Failed.")
    backup_id: str | None = Field(None, alias="backupID", description="barman's ID of the base backup.")
    server_name: str | None = Field(None, description="barman server name: the cluster's name.")
    destination_path: str | None = Field(None, description="s3://bucket/path the backup was written to.")
    started_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    stopped_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    size: int | None = Field(None, ge=0, description="Bytes of data backed up.")
    begin_wal: str | None = Field(None, description="First WAL segment the backup needs.")
    end_wal: str | None = Field(None, description="Last WAL segment the backup needs to be consistent.")
    begin_lsn: str | None = Field(None, alias="beginLSN")
    end_lsn: str | None = Field(None, alias="endLSN")
    timeline: int | None = Field(None, ge=0)
    instance: str | None = Field(None, description="Pod the backup was taken on.")
    error: str | None = Field(None, description="Why it failed (no secret values).")


def _not_reserved_name_rule() -> dict[str, str]:
    # barman treats these names as shortcuts and names shaped like its IDs as IDs.
    names = ", ".join(f"'{n}'" for n in RESERVED_BACKUP_NAMES)
    return _rule(
        f"!(self.metadata.name in [{names}]) && !self.metadata.name.matches('{BACKUP_ID_PATTERN}')",
        f"metadata.name must not be one of {', '.join(RESERVED_BACKUP_NAMES)} or look like a backup ID",
    )


# --- the ScheduledBackup kind ---------------------------------------------------------------------------

# Ranges must run forwards ("5-1" is refused); the pattern already bounds every number and the shape.
_SCHEDULE_SHAPE = _rule(
    f"self.matches('{cron.SCHEDULE_PATTERN}')",
    "schedule: five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7) of "
    "numbers, *, a-b and /step, comma-separated; or @hourly, @daily, @weekly, @monthly, @yearly",
)
_FORWARD_RANGES = _rule(
    "self.startsWith('@') || self.replace(' ', ',').split(',').all(i, !i.contains('-') || "
    "int(i.split('/')[0].split('-')[0]) <= int(i.split('/')[0].split('-')[1]))",
    "schedule: a range a-b needs a <= b",
)


class ScheduledBackupSpec(_Model):
    cluster: str = Field(
        max_length=MAX_CLUSTER_NAME_LENGTH, pattern=SERVER_NAME_PATTERN,
        description="PostgresCluster (same namespace) to back up.",
    )  # fmt: skip
    schedule: str = Field(
        max_length=cron.MAX_SCHEDULE_LENGTH,
        description=(
            "Cron schedule in UTC: minute hour day-of-month month day-of-week (numbers, *, a-b, /step, "
            "lists), or @hourly/@daily/@weekly/@monthly/@yearly. E.g. '0 3 * * *'."
        ),
        # The shape as a CEL rule rather than `pattern`, so a refusal says what is wrong in words.
        json_schema_extra=_validations(_SCHEDULE_SHAPE, _FORWARD_RANGES),
    )
    suspend: bool = Field(False, description="Take no backups while true.")
    immediate: bool = Field(False, description="Take one backup as soon as this is created.")

    @field_validator("schedule")
    @classmethod
    def _parses(cls, value: str) -> str:
        cron.parse(value)
        return value


class ScheduledBackupStatus(_StatusModel):
    last_schedule_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="Scheduled time of the last Backup made."
    )
    last_backup_name: str | None = Field(None, description="Name of the last Backup made.")
    next_schedule_time: str | None = Field(None, json_schema_extra={"format": "date-time"})


# --- parsing whole objects --------------------------------------------------------------------------------


def _parse_spec(model: type[_Model], obj: dict[str, Any], kind: str) -> Any:
    from pydantic import ValidationError

    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise ValueError(f"{kind}.spec: required")
    try:
        return model.model_validate(spec)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            parts.append(f"spec.{loc}: {e['msg'].removeprefix('Value error, ')}" if loc else e["msg"])
        raise ValueError(f"{kind}: " + "; ".join(parts)) from None


def parse_backup(obj: dict[str, Any]) -> BackupSpec:
    name = str((obj.get("metadata") or {}).get("name") or "")
    if name in RESERVED_BACKUP_NAMES or re.match(BACKUP_ID_PATTERN, name):
        raise ValueError(f"Backup metadata.name: {name!r} is reserved by barman")
    spec: BackupSpec = _parse_spec(BackupSpec, obj, BACKUP_KIND)
    return spec


def parse_scheduled_backup(obj: dict[str, Any]) -> ScheduledBackupSpec:
    spec: ScheduledBackupSpec = _parse_spec(ScheduledBackupSpec, obj, SCHEDULED_BACKUP_KIND)
    return spec


# --- CRDs -------------------------------------------------------------------------------------------------


def _crd(
    *,
    kind: str,
    plural: str,
    short: str,
    description: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    root_rules: list[dict[str, str]],
) -> dict[str, Any]:
    # Imported here: api/cluster.py imports this module for spec.backup, and api/crd.py imports models.
    from pg_operator.api.crd import structural_schema

    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(spec),
            "status": structural_schema(status, defaults=False),
        },
        "required": ["spec"],
    }
    if root_rules:
        schema["x-kubernetes-validations"] = root_rules
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "pg-operator", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["pg-operator"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def backup_crd() -> dict[str, Any]:
    return _crd(
        kind=BACKUP_KIND,
        plural=BACKUP_PLURAL,
        short="pgbackup",
        description="One base backup of a PostgresCluster to its object store (barman-cloud).",
        spec=BackupSpec,
        status=BackupStatus,
        columns=[
            {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Backup ID", "type": "string", "jsonPath": ".status.backupID"},
            {"name": "Size", "type": "integer", "jsonPath": ".status.size", "priority": 1},
            {"name": "Error", "type": "string", "jsonPath": ".status.error", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        root_rules=[_not_reserved_name_rule()],
    )


def scheduled_backup_crd() -> dict[str, Any]:
    return _crd(
        kind=SCHEDULED_BACKUP_KIND,
        plural=SCHEDULED_BACKUP_PLURAL,
        short="pgsbackup",
        description="Base backups of a PostgresCluster on a cron schedule; each run creates a Backup.",
        spec=ScheduledBackupSpec,
        status=ScheduledBackupStatus,
        columns=[
            {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
            {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
            {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend"},
            {"name": "Last Backup", "type": "string", "jsonPath": ".status.lastBackupName"},
            {"name": "Next", "type": "date", "jsonPath": ".status.nextScheduleTime", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        root_rules=[],
    )


_HEADER = (
    "# Generated from src/pg_operator/api/backup.py by `python -m pg_operator.api.manifests`. Do not edit.\n"
)


def rendered_backup_files() -> dict[str, str]:
    """CRD file name → YAML text (sorted keys, fixed width: equal models give byte-equal files)."""
    out = {}
    for plural, crd in ((BACKUP_PLURAL, backup_crd()), (SCHEDULED_BACKUP_PLURAL, scheduled_backup_crd())):
        body = yaml.safe_dump(crd, sort_keys=True, width=120, allow_unicode=True, default_flow_style=False)
        out[f"{plural}.yaml"] = _HEADER + body
    return out


def write_backup_manifests(out_dir: Path) -> list[Path]:
    """Write deploy/crd/backups.yaml and deploy/crd/scheduledbackups.yaml only (`python -m
    pg_operator.api.manifests` writes them with the PostgresCluster CRD through rendered_backup_files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered_backup_files().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


__all__ = [
    "COMPRESSIONS",
    "ROOT_BACKUP_RULES",
    "BackupConfiguration",
    "BackupSpec",
    "BackupStatus",
    "RecoveryBootstrap",
    "ScheduledBackupSpec",
    "ScheduledBackupStatus",
    "backup_crd",
    "parse_backup",
    "parse_scheduled_backup",
    "recovery_conflict",
    "rendered_backup_files",
    "scheduled_backup_crd",
    "write_backup_manifests",
]


def pod_env(
    backup: BackupConfiguration | None, recovery: RecoveryBootstrap | None = None
) -> list[dict[str, Any]]:
    """The postgres container's barman-cloud environment (hook for specs/statefulset.py): the cluster's
    own destination as AWS_*, a recovery source as PGOP_SOURCE_AWS_* (the restore commands map it back
    for their own process), all by secretKeyRef. The source's references are optional: the pod template
    keeps them for the cluster's life (bootstrap is immutable), and only the first bootstrap reads them,
    so deleting the source's Secret after the restore must not keep later pods from starting."""
    from pg_operator.backup.pod import barman_env, checksum_env
    from pg_operator.backup.recovery import SOURCE_ENV_PREFIX

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
    """instance.yaml's `backup` value for a cluster (hook for specs/configmap.py / InstanceConfig)."""
    from pg_operator.backup.instance_hook import RecoveryPlan, section

    archive = backup.archive_settings(cluster_name, bin_dir=bin_dir) if backup is not None else None
    plan = None
    if recovery is not None:
        plan = RecoveryPlan(
            source=recovery.source_store(bin_dir=bin_dir),
            target=recovery.target(),
            session_token=recovery.source.s3.credentials.session_token_key is not None,
        )
    return section(archive, plan)
