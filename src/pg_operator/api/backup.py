"""Typed models of backups: a cluster's `spec.backup` and `spec.bootstrap.recovery`, the `Backup` and
`ScheduledBackup` kinds, and the values their schemas are built from (bucket, path and backup-ID shapes,
compressions, archiving, retention and recovery-target forms).

These values are the API's contract: `pg_operator.backup` imports them to check what it turns into
barman-cloud commands, never the other way round.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from pg_operator.api.constants import GROUP
from pg_operator.api.crd import CustomResource
from pg_operator.api.schedule import MAX_SCHEDULE_LENGTH, SCHEDULE_PATTERN
from pg_operator.api.schedule import parse as parse_schedule
from pg_operator.api.schema import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    SpecModel,
    StatusModel,
    rule,
    validations,
)

# --- values the schema is built from --------------------------------------------------------------------

SECRET_NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # noqa: S105 (a pattern)
# A key of a Secret as the API server checks a secretKeyRef on the pod: not ".", "..", nor starting "..".
SECRET_KEY_PATTERN = "^([-_a-zA-Z0-9]|[.][-_a-zA-Z0-9])[-._a-zA-Z0-9]*$"  # noqa: S105 (a pattern)
# http(s), a host part and an optional path of printable ASCII without spaces: no whitespace or control
# character can reach barman-cloud's --endpoint-url. The backup package's ObjectStore checks the same
# pattern (full match), so what is admitted here is what the operator accepts.
ENDPOINT_PATTERN = "^https?://[!-.0-~]+(/[!-~]*)?$"
REGION_PATTERN = "^[a-z0-9][-a-z0-9]{0,31}$"
# Lower-case letters, digits, '.' and '-', beginning and ending with a letter or digit, no "..": S3's rule
# (the length, 3-63, is the field's). One pattern for the schema and ObjectStore.
BUCKET_PATTERN = "^[a-z0-9]([.]?[-a-z0-9])*[.]?[a-z0-9]$"
PATH_PATTERN = "^([A-Za-z0-9._-]+/)*[A-Za-z0-9._-]*$"
# barman refuses these as backup names (they are shortcuts for backup IDs), and a name shaped like a
# backup ID would be read as one.
RESERVED_BACKUP_NAMES: tuple[str, ...] = ("first", "last", "latest", "oldest", "last-failed", "auto")
BACKUP_ID_PATTERN = "^[0-9]{8}T[0-9]{6}$"

# What barman-cloud 3.19 accepts for both base backups and WAL (its base backups take no zstd or xz).
# gzip and bzip2 run at level 9 in one Python process; lz4 and snappy are C codecs, several times faster
# (docs/backups.md, "Measured").
Compression = Literal["gzip", "bzip2", "lz4", "snappy", "none"]
COMPRESSIONS: tuple[str, ...] = ("gzip", "bzip2", "lz4", "snappy", "none")

# A PostgreSQL size with a unit (max_slot_wal_keep_size is in MB when given without one).
WAL_SIZE_PATTERN = "^[1-9][0-9]{0,6}(MB|GB|TB)$"
ARCHIVE_TIMEOUT_PATTERN = "^[1-9][0-9]{0,4}(s|min)$"
DEFAULT_ARCHIVE_TIMEOUT = "60s"
DEFAULT_WAL_MAX_KEEP_SIZE = "10GB"

# Days, weeks or months.
RECOVERY_WINDOW_PATTERN = "^[1-9][0-9]{0,3}[dwm]$"
MAX_KEEP_LAST = 1000

LSN_PATTERN = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"
# RFC 3339 with an explicit offset: a recovery target without a zone would be read in the server's zone.
RFC3339_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,6})?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)


# --- checks the models and the backup package share ------------------------------------------------------


def parse_rfc3339(value: str) -> dt.datetime:
    """An RFC 3339 time with a zone, as an aware datetime; ValueError naming targetTime otherwise."""
    if not re.match(RFC3339_PATTERN, value):
        raise ValueError(
            f"recovery.targetTime: {value!r} must be RFC 3339 with a zone, e.g. 2026-12-01T08:30:00Z"
        )
    try:
        parsed = dt.datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        raise ValueError(f"recovery.targetTime: {value!r} is not a real date and time") from None
    return parsed


def check_retention(recovery_window: str | None, keep_last: int | None) -> None:
    """ValueError naming the field unless exactly one well-formed policy is given."""
    if (recovery_window is None) == (keep_last is None):
        raise ValueError("retention: set exactly one of recoveryWindow and keepLast")
    if recovery_window is not None and not re.match(RECOVERY_WINDOW_PATTERN, recovery_window):
        raise ValueError(
            f"retention.recoveryWindow: {recovery_window!r} must be a number of days, weeks or "
            "months such as 7d, 4w or 3m"
        )
    if keep_last is not None and not 1 <= keep_last <= MAX_KEEP_LAST:
        raise ValueError(f"retention.keepLast: {keep_last} must be between 1 and {MAX_KEEP_LAST}")


def destination_url(bucket: str, path: str) -> str:
    """barman-cloud's destination: s3://<bucket>[/<path>]."""
    path = path.strip("/")
    return f"s3://{bucket}/{path}" if path else f"s3://{bucket}"


@dataclass(frozen=True)
class ArchiveLocation:
    """Where one cluster's WAL and base backups are: <path>/<server_name>/ in a bucket at an endpoint."""

    bucket: str
    path: str
    server_name: str  # the cluster's name
    endpoint_url: str | None = None


def archive_conflict(source: ArchiveLocation, own: ArchiveLocation | None) -> str | None:
    """Why a restored cluster's own archive would be its source's (None when it cannot be)."""
    if own is None:
        return None
    same = (
        own.bucket == source.bucket
        and own.path.strip("/") == source.path.strip("/")
        and own.server_name == source.server_name
        and (own.endpoint_url or "") == (source.endpoint_url or "")
    )
    if same:
        return (
            "bootstrap.recovery: the new cluster would archive into the source's path "
            f"({destination_url(source.bucket, source.path)}/{source.server_name}); give it another name, "
            "bucket or path"
        )
    return None


# --- spec.backup ----------------------------------------------------------------------------------------


class S3Credentials(SpecModel):
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


class S3Destination(SpecModel):
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

    def location(self, server_name: str) -> ArchiveLocation:
        return ArchiveLocation(self.bucket, self.path, server_name, self.endpoint_url)


class Retention(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
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
        try:
            check_retention(self.recovery_window, self.keep_last)
        except ValueError as e:
            raise ValueError(f"backup.{e}") from None
        return self


class BackupConfiguration(SpecModel):
    """Continuous WAL archiving and base backups of one cluster to an S3-compatible store."""

    s3: S3Destination = Field(description="Where the backups and WAL go.")
    retention: Retention | None = Field(
        None, description="Which base backups (and the WAL they need) to delete; none by default."
    )
    compression: Compression = Field("gzip", description="Compression of WAL segments and base backups.")
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
    # Not part of the API (left out of the CRD's schema, so the API server prunes it from any request):
    # the barman server name of the generation the cluster archives to now (backup.generations), set by
    # the operator on its parsed copy of the spec after an in-place major upgrade. None: the cluster's name.
    generation_server_name: SkipJsonSchema[str | None] = None


# --- spec.bootstrap.recovery ----------------------------------------------------------------------------


class RecoverySource(SpecModel):
    cluster_name: str = Field(
        max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN,
        description="Name of the cluster whose backups are restored (its objects are under <path>/<name>/).",
    )  # fmt: skip
    s3: S3Destination = Field(description="Where that cluster's backups are.")
    # Not part of the API (see BackupConfiguration.generation_server_name): the generation of the source's
    # backups the target lies in, chosen by the operator from the source's generations file. None: the
    # source cluster's name (a source that was never upgraded with backups).
    generation_server_name: SkipJsonSchema[str | None] = None


class RecoveryBootstrap(SpecModel):
    """A new cluster from another one's base backup and WAL, up to a point in time."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
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

    def source_location(self) -> ArchiveLocation:
        return self.source.s3.location(self.source.cluster_name)


# Rule for the root of the PostgresCluster schema (it needs metadata.name, the cluster's barman server
# name): a restored cluster must not archive where its source does — same store, bucket, path and name.
# Another name, bucket or path is fine. `recovery_conflict` is the same test in Python.
def _endpoint(obj: str) -> str:
    return f"(has({obj}.endpointURL) ? {obj}.endpointURL : '')"


_SRC = "self.spec.bootstrap.recovery.source"
_OWN = "self.spec.backup.s3"
ROOT_BACKUP_RULES: tuple[dict[str, str], ...] = (
    rule(
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
    own = backup.s3.location(cluster_name) if backup is not None else None
    return archive_conflict(recovery.source_location(), own)


# --- the Backup kind ------------------------------------------------------------------------------------

BACKUP_KIND = "Backup"
BACKUP_PLURAL = "backups"
SCHEDULED_BACKUP_KIND = "ScheduledBackup"
SCHEDULED_BACKUP_PLURAL = "scheduledbackups"
# Owner label of the Backups a ScheduledBackup creates (value: its name).
SCHEDULED_BACKUP_LABEL = f"{GROUP}/scheduled-backup"


class BackupSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "self == oldSelf",
                "a Backup's spec cannot change; create another Backup",
                reason="FieldValueForbidden",
            )
        )
    )

    cluster: str = Field(
        max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN,
        description="PostgresCluster (same namespace) to back up; it needs spec.backup.",
    )  # fmt: skip


BackupPhase = Literal["Pending", "Running", "Completed", "Failed"]


class BackupStatus(StatusModel):
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


# barman treats these names as shortcuts and names shaped like its IDs as IDs.
_RESERVED_CEL = ", ".join(f"'{n}'" for n in RESERVED_BACKUP_NAMES)
_NOT_RESERVED_NAME = rule(
    f"!(self.metadata.name in [{_RESERVED_CEL}]) && !self.metadata.name.matches('{BACKUP_ID_PATTERN}')",
    f"metadata.name must not be one of {', '.join(RESERVED_BACKUP_NAMES)} or look like a backup ID",
)

BACKUP = CustomResource(
    kind=BACKUP_KIND,
    plural=BACKUP_PLURAL,
    short="pgbackup",
    description="One base backup of a PostgresCluster to its object store (barman-cloud).",
    spec=BackupSpec,
    status=BackupStatus,
    columns=(
        {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Backup ID", "type": "string", "jsonPath": ".status.backupID"},
        {"name": "Size", "type": "integer", "jsonPath": ".status.size", "priority": 1},
        {"name": "Error", "type": "string", "jsonPath": ".status.error", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
    root_rules=(_NOT_RESERVED_NAME,),
)


# --- the ScheduledBackup kind ---------------------------------------------------------------------------

# Ranges must run forwards ("5-1" is refused); the pattern already bounds every number and the shape.
_SCHEDULE_SHAPE = rule(
    f"self.matches('{SCHEDULE_PATTERN}')",
    "schedule: five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7) of "
    "numbers, *, a-b and /step, comma-separated; or @hourly, @daily, @weekly, @monthly, @yearly",
)
_FORWARD_RANGES = rule(
    "self.startsWith('@') || self.replace(' ', ',').split(',').all(i, !i.contains('-') || "
    "int(i.split('/')[0].split('-')[0]) <= int(i.split('/')[0].split('-')[1]))",
    "schedule: a range a-b needs a <= b",
)


class ScheduledBackupSpec(SpecModel):
    cluster: str = Field(
        max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN,
        description="PostgresCluster (same namespace) to back up.",
    )  # fmt: skip
    schedule: str = Field(
        max_length=MAX_SCHEDULE_LENGTH,
        description=(
            "Cron schedule in UTC: minute hour day-of-month month day-of-week (numbers, *, a-b, /step, "
            "lists), or @hourly/@daily/@weekly/@monthly/@yearly. E.g. '0 3 * * *'."
        ),
        # The shape as a CEL rule rather than `pattern`, so a refusal says what is wrong in words.
        json_schema_extra=validations(_SCHEDULE_SHAPE, _FORWARD_RANGES),
    )
    suspend: bool = Field(False, description="Take no backups while true.")
    immediate: bool = Field(False, description="Take one backup as soon as this is created.")

    @field_validator("schedule")
    @classmethod
    def _parses(cls, value: str) -> str:
        parse_schedule(value)
        return value


class ScheduledBackupStatus(StatusModel):
    last_schedule_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="Scheduled time of the last Backup made."
    )
    last_backup_name: str | None = Field(None, description="Name of the last Backup made.")
    next_schedule_time: str | None = Field(None, json_schema_extra={"format": "date-time"})


SCHEDULED_BACKUP = CustomResource(
    kind=SCHEDULED_BACKUP_KIND,
    plural=SCHEDULED_BACKUP_PLURAL,
    short="pgsbackup",
    description="Base backups of a PostgresCluster on a cron schedule; each run creates a Backup.",
    spec=ScheduledBackupSpec,
    status=ScheduledBackupStatus,
    columns=(
        {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster"},
        {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
        {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend"},
        {"name": "Last Backup", "type": "string", "jsonPath": ".status.lastBackupName"},
        {"name": "Next", "type": "date", "jsonPath": ".status.nextScheduleTime", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)
