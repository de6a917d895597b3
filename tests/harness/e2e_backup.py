"""Backups on real pods (the e2e tier): the moto server as the pods reach it, the spec of a cluster's
store, and waiting for conditions, Backups and archived WAL."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import cluster, s3_credentials_secret
from harness.pgcluster import connect_app, status
from harness.s3 import S3Server
from harness.waiting import wait_until

BRIDGE_HOST = os.environ.get("PGOP_E2E_HOST_IP", "10.244.0.1")  # the host, as pods see it
BUCKET = "e2e-backups"
SMALL_BACKUP = {"requests": {"cpu": "50m", "memory": "384Mi"}}  # the resources of the backup tests' clusters


@dataclass
class Moto:
    """The integration tests' moto server (authentication on), listening on every address of this
    (private) network namespace so the pods reach it at the host side of the pod bridge."""

    server: S3Server = field(repr=False)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def access_key_id(self) -> str:
        return self.server.access_key_id

    @property
    def secret_access_key(self) -> str:
        return self.server.secret_access_key

    @property
    def pod_endpoint(self) -> str:
        return f"http://{BRIDGE_HOST}:{self.port}"

    def client(self) -> Any:
        return self.server.client()

    def keys(self, prefix: str) -> list[str]:
        return self.server.keys(BUCKET, prefix)


@dataclass(frozen=True)
class Day2:
    """The e2e tier's day-2 cluster (its `day2` fixture): `name` in `namespace`, archiving to `moto`."""

    namespace: str
    name: str
    moto: Moto


DAY2_NAME = "day2-db"


def credentials_name(cluster_name: str) -> str:
    """The Secret holding the store credentials of one cluster: each cluster has its own, since the
    operator takes backup credentials (its own store's and a recovery source's alike) only from a Secret
    labelled for the cluster whose spec names it."""
    return f"{cluster_name}-s3"


def credentials(
    moto: Moto, namespace: str, cluster_name: str, *, secret_key: str | None = None
) -> dict[str, Any]:
    """The Secret `credentials_name(cluster_name)`, labelled for that cluster, with the store's keys
    (`secret_key`: a wrong secret key instead, for the tests of refused credentials)."""
    return s3_credentials_secret(credentials_name(cluster_name), namespace, moto.access_key_id,
                                 secret_key or moto.secret_access_key, cluster=cluster_name)  # fmt: skip


def s3(
    moto: Moto,
    cluster_name: str,
    *,
    bucket: str = BUCKET,
    endpoint: str | None = None,
) -> dict[str, Any]:
    """An S3 destination on the module's store as the cluster `cluster_name` names it (its own
    spec.backup, or the recovery source it restores from), read with that cluster's credentials Secret."""
    return {"endpointURL": endpoint or moto.pod_endpoint, "bucket": bucket, "path": "e2e",
            "credentials": {"secretName": credentials_name(cluster_name)}}  # fmt: skip


def backup_cluster(name: str, ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """A PostgresCluster of the backup tests: the harness's cluster() with their small requests."""
    return cluster(name, ns, replicas=replicas, resources=SMALL_BACKUP, **spec)


def status_condition(kube: Kube, ns: str, name: str, type_: str) -> dict[str, Any]:
    for cond in status(kube, ns, name).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def wait_condition(
    kube: Kube, ns: str, name: str, type_: str, want: str, reason: str | None, timeout: float
) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        cond = status_condition(kube, ns, name, type_)
        if cond.get("status") == want and (reason is None or cond.get("reason") == reason):
            return cond
        return None

    try:
        return dict(wait_until(f"{name} {type_}={want}/{reason}", ok, timeout, 3))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {status_condition(kube, ns, name, type_)}") from None


def get_backup(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return dict(get_json(kube, "backups.db.example.com", name, "-n", ns))


def wait_backup(kube: Kube, ns: str, name: str, timeout: float) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        st = get_backup(kube, ns, name).get("status") or {}
        return st if st.get("phase") in ("Completed", "Failed") else None

    return dict(wait_until(f"Backup {name} to finish", finished, timeout, 3))


def rows(kube: Kube, ns: str, name: str) -> list[int]:
    with connect_app(kube, ns, name) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM items ORDER BY id").fetchall()]


def superuser_sql(kube: Kube, ns: str, pod: str, sql: str, database: str = "postgres") -> str:
    """SQL as the superuser over the pod's Unix socket (what the operator's own execs do)."""
    res = kube.kubectl("exec", pod, "-n", ns, "-c", "postgres", "--", "psql", "-h", "/var/run/postgresql",
                       "-U", "postgres", "-d", database, "-AtX", "-c", sql)  # fmt: skip
    return str(res.stdout).strip()


def archived_after_switch(kube: Kube, ns: str, name: str, timeout: float = 120) -> str:
    """Switch WAL on the primary and wait until its pg_stat_archiver shows that segment archived (the
    status keeps archiving's state, not every segment: backup.archive_report)."""
    primary = str(status(kube, ns, name)["currentPrimary"])
    # A commit record first: on a segment with nothing written since the last switch, pg_switch_wal()
    # switches nothing and the name read below is the segment archived before.
    superuser_sql(kube, ns, primary, "SELECT txid_current()")
    segment = superuser_sql(kube, ns, primary, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    superuser_sql(kube, ns, primary, "SELECT pg_switch_wal()")

    def archived() -> bool:
        query = "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver"
        last = superuser_sql(kube, ns, primary, query)
        return len(last) == 24 and last[:8] >= segment[:8] and last[8:] >= segment[8:]

    wait_until(f"{name} to archive {segment}", archived, timeout, 3)
    return segment
