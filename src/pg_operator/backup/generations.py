"""Generations of a cluster's backups: one barman server name per PostgreSQL major the cluster ran.

After an in-place major upgrade the cluster has a new system identifier and starts again on timeline 1
with WAL segment names that continue the old major's; a later failover writes history files the old
major's archive may already hold. So the new major never archives where the old one did: each major the
cluster runs after an upgrade is a *generation* with a server name of its own. The first generation keeps
the cluster's name (existing archives stay where they are); a later one gets `-pg<major>`:

    <path>/orders-db/          generation 1, PostgreSQL 16 (and the generations file, below)
    <path>/orders-db-pg17/     generation 2, from the upgrade to 17 on

A cluster name is at most 50 characters (the CRD's name rule), so `<name>-pg<NN>` stays a DNS label
(≤ 63). Another cluster literally named `orders-db-pg17` in the same path would meet the store-ownership
marker: whichever claims the prefix first owns it, the other is refused loudly.

The record lives in the cluster's annotation `db.example.com/backup-generations` (JSON, written by the
major-upgrade sub-reconciler with the phase that switches) and, for restores when the source cluster may be
gone, in the store: `<path>/<cluster>/pg-operator-generations.json` (written by the backup pass of the
cluster). A generation covers the times from its `since` (the moment the old major stopped taking writes) to
the next one's; the first has no start.

Pure: plain values in, plain values out. May import `api`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pg_operator import objects
from pg_operator.api.backup import parse_rfc3339
from pg_operator.api.constants import API_VERSION, CLUSTER_LABEL

ANNOTATION: Final = "db.example.com/backup-generations"
# On a restored cluster: the generation of its source's backups it was restored from (decided once,
# before its first instance starts, from the source's generations file).
RECOVERY_ANNOTATION: Final = "db.example.com/recovery-source-generation"
STORE_FILE: Final = "pg-operator-generations.json"
_MAJOR = re.compile(r"\d{2}")
_SERVER = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Generation:
    server_name: str  # barman's server name: objects under <path>/<server_name>/
    major: str  # the PostgreSQL major whose WAL and base backups it holds
    since: str | None = None  # RFC 3339: when the previous generation stopped taking writes

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"serverName": self.server_name, "major": self.major}
        if self.since is not None:
            out["since"] = self.since
        return out


def server_name(cluster: str, major: str, first_major: str) -> str:
    """The barman server name of the generation running `major`: the cluster's own name for the first
    generation, `<cluster>-pg<major>` for each one an upgrade started."""
    return cluster if major == first_major else f"{cluster}-pg{major}"


def first(cluster: str, major: str) -> list[Generation]:
    """The record of a cluster that was never upgraded with backups: one generation under its name."""
    return [Generation(cluster, major)]


def parse(raw: str | bytes | None, where: str = ANNOTATION) -> list[Generation]:
    """The record as written by `dump` ([] for none); ValueError naming `where` when it is malformed."""
    if raw is None or raw == "" or raw == b"":
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        raise ValueError(f"{where}: not JSON") from None
    items = data.get("generations") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError(f"{where}: expected a list of generations")
    out: list[Generation] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{where}[{i}]: expected a mapping")
        name, major, since = item.get("serverName"), str(item.get("major") or ""), item.get("since")
        if not isinstance(name, str) or not _SERVER.fullmatch(name):
            raise ValueError(f"{where}[{i}].serverName: {name!r} is not a barman server name")
        if not _MAJOR.fullmatch(major):
            raise ValueError(f"{where}[{i}].major: {major!r} is not a PostgreSQL major")
        if since is not None:
            if not isinstance(since, str):
                raise ValueError(f"{where}[{i}].since: expected an RFC 3339 time")
            try:
                parse_rfc3339(since)
            except ValueError:
                raise ValueError(f"{where}[{i}].since: {since!r} is not an RFC 3339 time") from None
        elif i > 0:
            raise ValueError(f"{where}[{i}].since: required after the first generation")
        out.append(Generation(name, major, since))
    return out


def dump(generations: Sequence[Generation]) -> str:
    return json.dumps([g.to_mapping() for g in generations], sort_keys=True, separators=(",", ":"))


def store_document(cluster: str, generations: Sequence[Generation]) -> bytes:
    """The generations file in the first generation's prefix (what a restore reads)."""
    body = {"kind": "PostgresClusterBackupGenerations", "cluster": cluster,
            "generations": [g.to_mapping() for g in generations]}  # fmt: skip
    return json.dumps(body, sort_keys=True, indent=1).encode()


def store_key(first_prefix: str) -> str:
    """The generations file's key, under the first generation's prefix (`<path>/<cluster>/`)."""
    return first_prefix + STORE_FILE


def known(generations: Sequence[Generation], cluster: str, running_major: str | None) -> list[Generation]:
    """The record, or (none written) the one generation a never-upgraded cluster has."""
    if generations:
        return list(generations)
    return first(cluster, running_major or "") if running_major else []


def for_major(generations: Sequence[Generation], cluster: str, major: str) -> str:
    """The server name the cluster archives to while it runs `major`: the record's entry for it, else the
    name the rule gives (a switch whose annotation the cache does not show yet gets the same name)."""
    for g in reversed(generations):
        if g.major == major:
            return g.server_name
    if not generations:
        return cluster
    return server_name(cluster, major, generations[0].major)


def started(
    generations: Sequence[Generation], cluster: str, old_major: str, new_major: str, since: dt.datetime
) -> list[Generation]:
    """The record once the cluster switched from `old_major` to `new_major` (idempotent)."""
    gens = list(generations) or first(cluster, old_major)
    if gens[-1].major == new_major:
        return gens
    name = server_name(cluster, new_major, gens[0].major)
    return [*gens, Generation(name, new_major, rfc3339(since))]


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def for_target(generations: Sequence[Generation], target_time: str | None) -> Generation:
    """The generation a restore reads: the newest for the latest point (or an LSN, which names a place
    in the newest generation's WAL), else the one whose span holds the target time."""
    if not generations:
        raise ValueError("no generations recorded")
    if target_time is None:
        return generations[-1]
    target = parse_rfc3339(target_time)
    chosen = generations[0]
    for g in generations[1:]:
        if g.since is not None and parse_rfc3339(g.since) <= target:
            chosen = g
    return chosen


def major_mismatch(generation: Generation, spec_major: str, source: str) -> str | None:
    """Why a restore of `generation` into a cluster of `spec.version` `spec_major` is refused, or None.
    The restored data runs the major it was backed up with; the operator does not pick another for the
    user (spec.version is what the cluster runs, and it can only be raised later)."""
    if generation.major == spec_major:
        return None
    return (
        f"bootstrap.recovery: the target is in {source}'s backups of PostgreSQL {generation.major} "
        f"(server {generation.server_name}), but spec.version is {spec_major}; create the restored "
        f"cluster with version {generation.major!r} (upgrade it afterwards if you need a newer major)"
    )


def retired(
    generations: Sequence[Generation],
    completed_end_times: Sequence[Sequence[dt.datetime]],
    *,
    keep_last: int | None,
    window: dt.timedelta | None,
    now: dt.datetime,
) -> list[Generation]:
    """Older generations retention may empty, whole. `completed_end_times[i]`: when generation i's
    completed base backups ended. A generation goes only when the later ones alone keep what the policy
    promises: for keepLast N, N completed backups in later generations; for a recovery window, a
    completed backup in a later generation that ended before the window began (then every time in the
    window is restorable from later generations). The current generation is never retired here (its
    own backups follow `retention.obsolete_backups`)."""
    out: list[Generation] = []
    for i, g in enumerate(generations[:-1]):
        later = sorted(t for ends in completed_end_times[i + 1 :] for t in ends)
        if keep_last is not None:
            if len(later) >= keep_last:
                out.append(g)
        elif window is not None and later and later[0] < now - window:
            out.append(g)
    return out


# --- read from a cluster object ----------------------------------------------------------------------------


def of_cluster(body: Mapping[str, Any]) -> list[Generation]:
    """The cluster's record from its annotation ([] when none, or unreadable: the cluster's name then)."""
    try:
        return parse(objects.annotation(body, ANNOTATION))
    except ValueError:
        return []


def current_server(body: Mapping[str, Any]) -> str:
    """Where the cluster archives now: its newest generation's server name, or its own name."""
    gens = of_cluster(body)
    return gens[-1].server_name if gens else objects.name(body)


def recovery_generation(body: Mapping[str, Any]) -> Generation | None:
    raw = objects.annotation(body, RECOVERY_ANNOTATION)
    if not raw:
        return None
    try:
        gens = parse(f"[{raw}]", RECOVERY_ANNOTATION)
    except ValueError:
        return None
    return gens[0] if gens else None


def target_time_of(target_time: str | None, backup_id: str | None) -> str | None:
    """The time that places a restore in a generation: its target time, else the start of the backup it
    names (barman's IDs are the start time, UTC in the pods: 20261202T220000), else none (the latest)."""
    if target_time is not None:
        return target_time
    if backup_id is not None and re.fullmatch(r"\d{8}T\d{6}", backup_id):
        b = backup_id
        return f"{b[0:4]}-{b[4:6]}-{b[6:8]}T{b[9:11]}:{b[11:13]}:{b[13:15]}Z"
    return None


# --- the new generation's first base backup -----------------------------------------------------------------


def base_backup_name(generation: Generation) -> str:
    """The Backup the operator creates for a new generation (a DNS subdomain; never shaped like a
    barman backup ID)."""
    return f"{generation.server_name}-base"


def base_backup_object(
    namespace: str, cluster: str, cluster_uid: str, generation: Generation
) -> dict[str, Any]:
    """A Backup of the cluster, owned by it (deleted with it), labelled like every Backup of it."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Backup",
        "metadata": {
            "name": base_backup_name(generation),
            "namespace": namespace,
            "labels": {CLUSTER_LABEL: cluster},
            "annotations": {ANNOTATION: generation.server_name},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "PostgresCluster", "name": cluster, "uid": cluster_uid}
            ],
        },
        "spec": {"cluster": cluster},
    }


def taken_on_primary(backup: Mapping[str, Any]) -> bool:
    """A new generation's first base backup runs on the primary. The replicas were just re-cloned after
    pg_upgrade, which runs the new major with full_page_writes=off, and PostgreSQL refuses a base backup
    on a standby that replayed such WAL since its last restartpoint (the e2e met it under load)."""
    return bool(objects.annotation(backup, ANNOTATION))


# How long after an in-place major upgrade every base backup runs on the primary. A standby that replayed
# the upgrade's WAL (written with full_page_writes=off) refuses pg_backup_start until its next
# restartpoint, which follows the primary's next checkpoint (checkpoint_timeout, 5 min by default;
# later on a lagging standby).
PRIMARY_AFTER_UPGRADE: Final = dt.timedelta(minutes=30)


def just_upgraded(cluster: Mapping[str, Any] | None, now: dt.datetime) -> bool:
    """The cluster's newest generation began less than PRIMARY_AFTER_UPGRADE ago."""
    gens = of_cluster(cluster or {})
    if len(gens) < 2 or gens[-1].since is None:
        return False
    try:
        since = parse_rfc3339(gens[-1].since)
    except ValueError:
        return False
    return now - since < PRIMARY_AFTER_UPGRADE


def backup_gap(
    generations: Sequence[Generation], backups: Sequence[Mapping[str, Any]]
) -> tuple[str, str, str] | None:
    """LastBackupSucceeded while the newest generation has no completed base backup: a point-in-time
    restore to a time after the switch is not possible yet (None when it is, or with one generation)."""
    if len(generations) < 2:
        return None
    now, before = generations[-1], generations[-2]
    for b in backups:
        st = objects.status(b)
        if st.get("phase") == "Completed" and st.get("serverName") == now.server_name:
            return None
    return (
        "False",
        "NewGenerationNotBackedUp",
        f"PostgreSQL {now.major} archives to server {now.server_name} since {now.since}, and it has no "
        f"completed base backup yet (Backup {base_backup_name(now)}): a point-in-time restore to a time "
        f"after the upgrade is not possible until one completes; times before it restore PostgreSQL "
        f"{before.major} from server {before.server_name}",
    )
