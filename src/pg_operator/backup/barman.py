"""barman-cloud command lines, as argv lists, and the environment they run with.

Credentials travel only in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, set in the pod
from the Secret by `secretKeyRef`), never in argv, a config file or a log line: argv is visible in
`ps` and in pg_stat_activity-adjacent logs, the environment is not.

Layout in the bucket (barman's): `s3://<bucket>/<path>/<serverName>/{base,wals}/…`; serverName is the
cluster's name, so clusters can share a bucket and path, and a restored cluster writes under its own name.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator.api.backup import (
    BACKUP_ID_PATTERN,
    BUCKET_PATTERN,
    COMPRESSIONS,
    ENDPOINT_PATTERN,
    PATH_PATTERN,
    RESERVED_BACKUP_NAMES,
    ArchiveLocation,
    Compression,
    destination_url,
)
from pg_operator.api.schema import NAME_PATTERN

_COMPRESSION_FLAG = {
    "gzip": ["--gzip"], "bzip2": ["--bzip2"], "lz4": ["--lz4"], "snappy": ["--snappy"], "none": [],
}  # fmt: skip

# barman-cloud-backup builds and compresses the tar stream in its main process and hands parts (20 MB
# with the default --max-archive-size) to this many upload processes (docs/backups.md, "Measured").
BASE_BACKUP_JOBS = 2

# Where the image installs barman-cloud (images/postgres/recipe.sh, its venv).
DEFAULT_BIN_DIR = "/opt/pg-operator/bin"

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"  # noqa: S105 (a variable name)
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"  # noqa: S105 (a variable name)
REGION_ENV = "AWS_DEFAULT_REGION"
# boto3 >= 1.36 sends CRC checksums on every upload by default; many S3-compatible servers refuse them or
# return none. Only when the operation requires one.
CHECKSUM_ENV: dict[str, str] = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}


@dataclass(frozen=True)
class ObjectStore:
    """One cluster's place in an S3-compatible store, and how barman-cloud reaches it."""

    bucket: str
    server_name: str  # barman's "server": the cluster whose backups and WAL these are
    path: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    compression: Compression = "gzip"
    bin_dir: str = DEFAULT_BIN_DIR

    def __post_init__(self) -> None:
        # The API's patterns, matched whole (re.match's `$` would let a trailing newline through).
        if not 3 <= len(self.bucket) <= 63 or not re.fullmatch(BUCKET_PATTERN, self.bucket):
            raise ValueError(f"backup.s3.bucket: {self.bucket!r} is not an S3 bucket name")
        if not re.fullmatch(PATH_PATTERN, self.path.strip("/")):
            raise ValueError(
                f"backup.s3.path: {self.path!r} may hold only letters, digits, '.', '_', '-', '/'"
            )
        # barman's server name is the cluster's name.
        if not re.match(NAME_PATTERN, self.server_name):
            raise ValueError(f"server name {self.server_name!r} is not a DNS label")
        if self.endpoint_url is not None and not re.fullmatch(ENDPOINT_PATTERN, self.endpoint_url):
            raise ValueError(f"backup.s3.endpointURL: {self.endpoint_url!r} must be an http(s) URL")
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"backup.compression: {self.compression!r} must be one of {', '.join(COMPRESSIONS)}"
            )

    @property
    def destination_url(self) -> str:
        return destination_url(self.bucket, self.path)

    @property
    def location(self) -> ArchiveLocation:
        return ArchiveLocation(self.bucket, self.path, self.server_name, self.endpoint_url)

    @property
    def prefix(self) -> str:
        """The key prefix all of this server's objects live under."""
        path = self.path.strip("/")
        return f"{path}/{self.server_name}/" if path else f"{self.server_name}/"

    def with_server(self, server_name: str) -> ObjectStore:
        return ObjectStore(
            bucket=self.bucket,
            server_name=server_name,
            path=self.path,
            endpoint_url=self.endpoint_url,
            region=self.region,
            compression=self.compression,
            bin_dir=self.bin_dir,
        )

    def to_mapping(self) -> dict[str, Any]:
        """camelCase form, as carried in instance.yaml."""
        out: dict[str, Any] = {"bucket": self.bucket, "serverName": self.server_name, "path": self.path}
        if self.endpoint_url is not None:
            out["endpointURL"] = self.endpoint_url
        if self.region is not None:
            out["region"] = self.region
        out["compression"] = self.compression
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, bin_dir: str = DEFAULT_BIN_DIR) -> ObjectStore:
        for key in ("bucket", "serverName"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"object store: {key} is required")
        return cls(
            bucket=data["bucket"],
            server_name=data["serverName"],
            path=str(data.get("path") or ""),
            endpoint_url=data.get("endpointURL"),
            region=data.get("region"),
            compression=data.get("compression", "gzip"),
            bin_dir=bin_dir,
        )


def _tool(store: ObjectStore, name: str) -> str:
    return f"{store.bin_dir.rstrip('/')}/{name}" if store.bin_dir else name


def _connection(store: ObjectStore) -> list[str]:
    args = ["--cloud-provider", "aws-s3"]
    if store.endpoint_url:
        args += ["--endpoint-url", store.endpoint_url]
    return args


def client_env(store: ObjectStore) -> dict[str, str]:
    """The non-secret environment every barman-cloud call needs (the credentials come on top)."""
    env = dict(CHECKSUM_ENV)
    if store.region:
        env[REGION_ENV] = store.region
    return env


def credentials_env(
    access_key_id: str, secret_access_key: str, session_token: str | None = None
) -> dict[str, str]:
    """The credential variables barman-cloud (boto3) reads. Only for a child's environment."""
    env = {ACCESS_KEY_ENV: access_key_id, SECRET_KEY_ENV: secret_access_key}
    if session_token:
        env[SESSION_TOKEN_ENV] = session_token
    return env


# --- WAL ------------------------------------------------------------------------------------------------


def wal_archive_argv(store: ObjectStore) -> list[str]:
    """barman-cloud-wal-archive for one segment; PostgreSQL appends nothing, so `%p` is the last word."""
    return [
        _tool(store, "barman-cloud-wal-archive"),
        *_connection(store),
        *_COMPRESSION_FLAG[store.compression],
        store.destination_url,
        store.server_name,
        "%p",
    ]


def wal_restore_argv(store: ObjectStore) -> list[str]:
    """barman-cloud-wal-restore of `%f` into `%p` (restore_command); compression is detected on read."""
    return [
        _tool(store, "barman-cloud-wal-restore"),
        *_connection(store),
        store.destination_url,
        store.server_name,
        "%f",
        "%p",
    ]


def archive_command(store: ObjectStore) -> str:
    """archive_command, a shell line. shlex keeps %p / %f as they are ('%' needs no quoting)."""
    return shlex.join(wal_archive_argv(store))


def restore_command(store: ObjectStore) -> str:
    return shlex.join(wal_restore_argv(store))


def check_wal_archive_argv(store: ObjectStore, *, timeline: int | None = None) -> list[str]:
    """barman-cloud-check-wal-archive: exits non-zero when the server's WAL path already holds WAL (of
    any timeline, or ≥ `timeline`), so a new cluster never archives over someone else's history."""
    argv = [_tool(store, "barman-cloud-check-wal-archive"), *_connection(store)]
    if timeline is not None:
        argv += ["--timeline", str(timeline)]
    return [*argv, store.destination_url, store.server_name]


# --- base backups ---------------------------------------------------------------------------------------


def base_backup_argv(
    store: ObjectStore,
    *,
    name: str,
    host: str,
    port: int,
    user: str,
    dbname: str = "postgres",
    jobs: int = BASE_BACKUP_JOBS,
) -> list[str]:
    """barman-cloud-backup of the local instance (it reads PGDATA itself, so it runs in the primary's
    pod). `name` (the Backup object's name) makes the backup findable: barman's backup IDs are times.
    The password, if any, comes from PGPASSWORD / PGPASSFILE in the environment."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$", name):
        raise ValueError(f"backup name {name!r} must be letters, digits, '.', '_', '-'")
    if name in RESERVED_BACKUP_NAMES or re.match(BACKUP_ID_PATTERN, name):
        raise ValueError(f"backup name {name!r} is reserved by barman (a shortcut or a backup ID)")
    if jobs < 1:
        raise ValueError(f"base backup jobs: {jobs} must be at least 1")
    return [
        _tool(store, "barman-cloud-backup"),
        *_connection(store),
        *_COMPRESSION_FLAG[store.compression],
        "--immediate-checkpoint",
        "--jobs",
        str(jobs),
        "--name",
        name,
        "--host",
        host,
        "--port",
        str(port),
        "--user",
        user,
        "--dbname",
        dbname,
        store.destination_url,
        store.server_name,
    ]


def backup_list_argv(store: ObjectStore) -> list[str]:
    return [_tool(store, "barman-cloud-backup-list"), *_connection(store), "--format", "json",
            store.destination_url, store.server_name]  # fmt: skip


def backup_show_argv(store: ObjectStore, backup_id: str) -> list[str]:
    """barman-cloud-backup-show: one backup's metadata (begin/end WAL and time, size) as JSON."""
    return [_tool(store, "barman-cloud-backup-show"), *_connection(store), "--format", "json",
            store.destination_url, store.server_name, backup_id]  # fmt: skip


def delete_backup_argv(store: ObjectStore, backup_id: str) -> list[str]:
    """Delete one backup, and the WAL no remaining backup needs."""
    return [_tool(store, "barman-cloud-backup-delete"), *_connection(store), "--backup-id", backup_id,
            store.destination_url, store.server_name]  # fmt: skip


def restore_argv(
    store: ObjectStore,
    destination_dir: str,
    *,
    backup_id: str | None = None,
    target_time: str | None = None,
    target_lsn: str | None = None,
) -> list[str]:
    """barman-cloud-restore of a base backup into an empty directory. Without a backup ID barman picks
    the newest backup that ends before the target ("auto"), or the newest one for "latest"."""
    if target_time and target_lsn:
        raise ValueError("recovery: set at most one of targetTime and targetLSN")
    argv = [_tool(store, "barman-cloud-restore"), *_connection(store)]
    if backup_id is None and target_time:
        argv += ["--target-time", target_time]
    if backup_id is None and target_lsn:
        argv += ["--target-lsn", target_lsn]
    chosen = backup_id or ("auto" if (target_time or target_lsn) else "latest")
    return [*argv, store.destination_url, store.server_name, chosen, destination_dir]
