"""In-place major upgrade: the runbook's decisions, as pure functions (docs/major-upgrades.md).

The upgrade moves a cluster's data from the major it runs (the StatefulSet's `PGOP_PG_MAJOR`) to a higher
`spec.version` with `pg_upgrade --link` on the primary's volume. Its phases, in order:

  Checking            `pg_upgrade --check` against the live primary, the new major's binaries staged on the
                      primary's volume beside the running old ones; nothing stops. A failed check ends
                      the attempt (CheckFailed) with pg_upgrade's own reason, the cluster untouched.
  Upgrading           writes stop (Patroni paused on every member, the primary shut down cleanly, each
                      replica once it replayed that shutdown), `pg_upgrade --link` fills the new cluster the
                      check prepared; replicas at the primary's checkpoint get the new cluster's unlinked
                      files and hard links to their own data (major_upgrade_replicas), the others are
                      emptied to be re-cloned
  Starting            the directories swap and the new major starts on the primary
  ReplicasCatchingUp  replicas start on the new major and follow the new primary
  Analyzing           statistics: pg 18 carries them over (only what is missing is analysed), older
                      majors are analysed in stages so plans recover quickly
  Done

The point of no return is the new major's first start: until then the old data directory is intact
(with --link, pg_upgrade renames `global/pg_control` to `pg_control.old` only once linking begins, and
renaming it back restores the old cluster), so any failure before it rolls back to the old major.
Afterwards the old data's files are shared with the new cluster and only a restore of the old major's
backups can go back. The phases, their one transition table and the state kept between reconciles are in
`orchestration/major_upgrade_state.py`.

May import `api`, `objects`; never `specs` or `controller`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pg_operator.api.constants import DATA_MOUNT, PGDATA

# Where the upgrade keeps its files on the primary's volume, beside (not inside) the data directory, so a
# base backup or pg_rewind of PGDATA never carries them.
WORK_DIR: Final = f"{DATA_MOUNT}/major-upgrade"


def staged_binaries(version: str) -> str:
    """Where the new major's PostgreSQL tree is copied on the primary's volume (bin/, lib/, share/)."""
    return f"{WORK_DIR}/postgresql-{version}"


def major_of(version: str) -> int:
    """ "16" or "16.15" → 16; anything else is an error naming the value."""
    m = re.fullmatch(r"(\d{2})(?:\.\d+)?", version.strip())
    if not m:
        raise ValueError(f"version {version!r} is not a PostgreSQL version like '16' or '16.15'")
    return int(m.group(1))


@dataclass(frozen=True)
class UpgradeRequest:
    old_major: str
    new_major: str


def requested(spec_major: str, running_major: str | None) -> UpgradeRequest | None:
    """The upgrade the spec asks for, or None. A new cluster (nothing running yet) needs none; a lower
    spec than what runs is refused (the API server refuses it at admission too)."""
    if running_major is None or major_of(spec_major) == major_of(running_major):
        return None
    if major_of(spec_major) < major_of(running_major):
        raise ValueError(
            f"spec.version {spec_major} is lower than the running major {running_major}: a major "
            "version can only be raised"
        )
    return UpgradeRequest(old_major=running_major, new_major=spec_major)


def members_paused(members: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every member's Patroni has taken the pause: an HA loop that sees it writes `pause: true`
    into the member's data (the pod's `status` annotation) when it starts, and every later loop reads the
    pause again, so from then on no member starts, restarts or promotes PostgreSQL. `members`: each
    member's data; an empty list is not paused (nothing said so)."""
    return bool(members) and all(m.get("pause") is True for m in members)


# --- commands ---------------------------------------------------------------------------------------


def statistics_argv(new_bin: str, new_major: str) -> list[str]:
    """After the upgrade: PostgreSQL 18's pg_upgrade carries planner statistics over, so only what it did
    not carry (extended statistics) is analysed; older majors start without statistics and are analysed
    in stages (a rough pass first, so plans recover within seconds, then the full one)."""
    if major_of(new_major) >= 18:
        return [f"{new_bin}/vacuumdb", "--all", "--analyze-only", "--missing-stats-only", "--jobs=2"]
    return [f"{new_bin}/vacuumdb", "--all", "--analyze-in-stages", "--jobs=2"]


# --- the data-plane steps: shell scripts run in the primary's container as the postgres user ---------


@dataclass(frozen=True)
class Layout:
    """Where a step finds things. In a pod: the old major's binaries are the image's own, the new major's
    tree was staged on the data volume, PGDATA and the work directory are on that volume (one filesystem,
    as --link needs). Tests point these at a local tree."""

    old_bin: str
    new_home: str  # the new major's tree: bin/, lib/, share/
    pgdata: str = PGDATA
    work: str = WORK_DIR
    encoding: str = "UTF8"  # template0's, which the new cluster must match
    locale: str = "C.UTF-8"

    @property
    def new_bin(self) -> str:
        return f"{self.new_home}/bin"

    @property
    def new_pgdata(self) -> str:
        return f"{self.work}/pgdata-new"

    @property
    def check_pgdata(self) -> str:
        return f"{self.work}/pgdata-check"

    @property
    def prepared_pgdata(self) -> str:
        """The new cluster a passing check leaves for the upgrade."""
        return f"{self.work}/pgdata-prepared"

    def kept_old(self, old_major: str) -> str:
        return f"{self.work}/pgdata-{old_major}"


def _variables(layout: Layout, **extra: str) -> str:
    """The scripts' inputs as shell variable assignments (quoted), so the script bodies stay constant."""
    values = {
        "OLD_BIN": layout.old_bin, "NEW_HOME": layout.new_home, "NEW_BIN": layout.new_bin,
        "PGDATA": layout.pgdata, "WORK": layout.work, "ENCODING": layout.encoding, "LOCALE": layout.locale,
        **extra,
    }  # fmt: skip
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


# initdb of a new cluster ($1) with the old cluster's checksum setting (read from its pg_control); initdb
# 18 turns checksums on unless told, so the setting is always explicit (pg_upgrade requires them equal).
_INITDB = r"""
new_cluster() {
  ck=$("$OLD_BIN/pg_controldata" "$PGDATA" | sed -n 's/^Data page checksum version: *//p')
  if [ "$ck" = 0 ]; then ck=--no-data-checksums; else ck=--data-checksums; fi
  "$NEW_BIN/initdb" -D "$1" -U postgres --encoding="$ENCODING" --locale="$LOCALE" "$ck" >/dev/null
}
sysid() {
  "$NEW_BIN/pg_controldata" "$PGDATA" | sed -n 's/^Database system identifier: */system identifier: /p'
}
"""

_CHECK = r"""
set -eu
export LD_LIBRARY_PATH="$NEW_HOME/lib"
# The new image's binaries must be the new major's (an image of the user's may hold another).
if [ -n "$NEW_MAJOR" ]; then
  have=$("$NEW_BIN/postgres" -V | sed -n 's/^postgres (PostgreSQL) //p')
  if [ "${have%%.*}" != "$NEW_MAJOR" ]; then
    echo "fatal: the new image holds PostgreSQL ${have:-(none found)}, not $NEW_MAJOR" >&2
    exit 1
  fi
fi
mkdir -p "$WORK"
rm -rf "$WORK/pgdata-check" "$WORK/pgdata-prepared"
new_cluster "$WORK/pgdata-check"
cd "$WORK"
rc=0
"$NEW_BIN/pg_upgrade" --old-bindir "$OLD_BIN" --new-bindir "$NEW_BIN" --old-datadir "$PGDATA" \
  --new-datadir "$WORK/pgdata-check" --username postgres --socketdir "$WORK" --jobs=2 --check || rc=$?
# A passing check's new cluster is the one the upgrade uses (checking and then upgrading into the same
# freshly initialised cluster is pg_upgrade's own procedure): its initdb then costs no downtime.
if [ "$rc" = 0 ]; then mv "$WORK/pgdata-check" "$WORK/pgdata-prepared" || rc=$?; fi
rm -rf "$WORK/pgdata-check"
exit $rc
"""

_UPGRADE = r"""
set -u
export LD_LIBRARY_PATH="$NEW_HOME/lib"
NEW="$WORK/pgdata-new" KEPT="$WORK/pgdata-$OLD_MAJOR"
rollback() {
  if [ ! -d "$PGDATA" ] && [ -d "$KEPT" ]; then mv "$KEPT" "$PGDATA"; fi
  if [ -f "$PGDATA/global/pg_control.old" ] && [ ! -f "$PGDATA/global/pg_control" ]; then
    mv "$PGDATA/global/pg_control.old" "$PGDATA/global/pg_control"
  fi
  rm -rf "$NEW"
}
fail() {
  echo "major upgrade failed: $*" >&2
  rollback
  echo "rolled back: PGDATA is $OLD_MAJOR's again" >&2
  exit 1
}
have=$(cat "$PGDATA/PG_VERSION")
if [ "$have" = "$NEW_MAJOR" ]; then sysid; exit 0; fi
[ "$have" = "$OLD_MAJOR" ] || { echo "PGDATA holds PostgreSQL $have, not $OLD_MAJOR" >&2; exit 1; }
# With backups, the old major's archive must hold all of its WAL before its data is upgraded: a clean
# shutdown switched the last segment and the archiver archived it (a .ready file left means it could not).
if [ "$REQUIRE_ARCHIVED" = 1 ]; then
  left=$(ls "$PGDATA/pg_wal/archive_status" 2>/dev/null | grep -c '[.]ready$' || true)
  [ "$left" = 0 ] || fail "$left WAL segment(s) of PostgreSQL $OLD_MAJOR were not archived when it stopped"
fi
mkdir -p "$WORK" && rm -rf "$NEW" || fail "no work directory"
# The old cluster's last checkpoint, which each replica's must equal to keep its data (a retried stop reads
# it here once pg_upgrade has renamed the old pg_control).
"$OLD_BIN/pg_controldata" "$PGDATA" | sed -n 's/^Latest checkpoint location: *//p' >"$WORK/old-checkpoint" \
  || fail "reading the old cluster's checkpoint"
if [ -f "$WORK/pgdata-prepared/PG_VERSION" ] && [ "$(cat "$WORK/pgdata-prepared/PG_VERSION")" = "$NEW_MAJOR" ]
then
  mv "$WORK/pgdata-prepared" "$NEW" || fail "taking the checked new cluster"
  echo "new cluster: the one the check prepared"
else
  rm -rf "$WORK/pgdata-prepared"
  new_cluster "$NEW" || fail "initdb of the new cluster"
fi
cd "$WORK" || fail "no work directory"
"$NEW_BIN/pg_upgrade" --old-bindir "$OLD_BIN" --new-bindir "$NEW_BIN" --old-datadir "$PGDATA" \
  --new-datadir "$NEW" --username postgres --socketdir "$WORK" --jobs=2 --link || fail "pg_upgrade exited $?"
mv "$PGDATA" "$KEPT" || fail "moving the old data directory aside"
mv "$NEW" "$PGDATA" || fail "moving the new data directory into place"
# Patroni keeps initdb's postgresql.conf as postgresql.base.conf and writes its own postgresql.conf that
# includes it: give the new cluster the same arrangement, with the new major's own defaults.
if [ -f "$KEPT/postgresql.base.conf" ] && [ ! -f "$PGDATA/postgresql.base.conf" ]; then
  mv "$PGDATA/postgresql.conf" "$PGDATA/postgresql.base.conf"
fi
sysid
"""


def check_script(layout: Layout, new_major: str = "") -> str:
    """`pg_upgrade --check` against the running old server (it reads the socket and port from
    postmaster.pid), into a new cluster initialised for it; exit status and output are pg_upgrade's.
    A passing check keeps that cluster as `Layout.prepared_pgdata` for the upgrade (so initdb is not
    part of the write outage); a failing one removes it. Nothing of the old cluster is changed.
    `new_major`: first, the new binaries must be that major's (else a `fatal:` line says what they are)."""
    return _variables(layout, NEW_MAJOR=new_major) + _INITDB + _CHECK


def upgrade_script(layout: Layout, old_major: str, new_major: str, *, require_archived: bool = False) -> str:
    """The upgrade on the stopped old cluster: a new cluster (the one a passing check prepared, else a
    fresh initdb), `pg_upgrade --link` into it, then the two
    data directories swap (the old one kept in the work directory). Any failure rolls back: the old
    `global/pg_control` renamed back (pg_upgrade renames it once linking begins), the new cluster
    removed, the old directory back in place — the old major then starts on intact data. Run again after
    success, it changes nothing (PGDATA already holds the new major). Prints `system identifier: N`.
    `require_archived` (a cluster with backups): a WAL segment the old major did not archive before it
    stopped fails the upgrade before anything changed."""
    extra = {"OLD_MAJOR": old_major, "NEW_MAJOR": new_major,
             "REQUIRE_ARCHIVED": "1" if require_archived else "0"}  # fmt: skip
    return _variables(layout, **extra) + _INITDB + _UPGRADE


# Before writes stop (a cluster with backups): the segment being written is switched out and archived,
# so the archive is current and known to work before the outage starts. $PSQL is the superuser's psql.
_ARCHIVE_CURRENT = r"""
set -u
seg=$($PSQL -c "select pg_walfile_name(pg_switch_wal())") || { echo "pg_switch_wal failed" >&2; exit 2; }
i=0 last=""
while [ "$i" -lt "$WAIT" ]; do
  ok=$($PSQL -c "select coalesce(last_archived_wal >= '$seg'
                   and last_archived_wal ~ '^[0-9A-F]{24}$', false) from pg_stat_archiver") || ok=f
  if [ "$ok" = t ]; then echo "archived $seg"; exit 0; fi
  last=$($PSQL -c "select coalesce(last_failed_wal, '') || ' ' || coalesce(last_failed_time::text, '')
                   from pg_stat_archiver" 2>/dev/null || true)
  i=$((i + 1)); sleep 1
done
echo "WAL segment $seg was not archived within $WAIT s (last failure: ${last:-none})" >&2
exit 1
"""


def archive_current_script(psql: str, wait_seconds: int) -> str:
    """Switch the primary's WAL segment and wait (at most `wait_seconds`) until pg_stat_archiver shows
    it archived; exit 0 then, else non-zero with why on stderr. `psql`: the command line of the
    superuser's psql (unaligned, tuples only)."""
    return f"PSQL={shlex.quote(psql)}\nWAIT={int(wait_seconds)}\n" + _ARCHIVE_CURRENT


# --- reading what pg_upgrade said ------------------------------------------------------------------

_NOISE = re.compile(
    r"^(Performing Consistency Checks|-+|\s*ok\s*$|Checking .*ok$|\*Clusters are compatible\*)"
)


def check_failure_reason(output: str, limit: int = 600) -> str:
    """The part of `pg_upgrade --check` output that says why it failed: the failing check's line and the
    explanation after it (`fatal`, `Your installation contains …`, the report file's name), without
    the progress lines of the checks that passed; cut to `limit` characters for a condition message."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    start = next(
        (
            i
            for i, ln in enumerate(lines)
            if ln.strip().lower() in ("fatal", "failure") or "fatal" in ln.lower()
        ),
        None,
    )
    if start is not None and start > 0 and not lines[start - 1].strip().endswith("ok"):
        start -= 1  # the check that failed: "Checking for reg* data types in user tables   fatal"
    picked = lines[start:] if start is not None else [ln for ln in lines if ln and not _NOISE.match(ln)]
    text = " ".join(ln.strip() for ln in picked if ln.strip())
    text = re.sub(r"\s+", " ", text).strip() or "pg_upgrade --check failed without saying why"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def system_identifier(controldata: str) -> str:
    """`Database system identifier:` from pg_controldata's output (the new cluster's differs from the
    old: Patroni's DCS must be told before the new primary starts)."""
    m = re.search(r"^Database system identifier:\s*(\d+)\s*$", controldata, re.MULTILINE)
    if not m:
        raise ValueError("pg_controldata output has no 'Database system identifier' line")
    return m.group(1)


def controldata_settings(controldata: str) -> dict[str, str]:
    """What initdb of the new cluster must match, from the old cluster's pg_controldata: checksums."""
    m = re.search(r"^Data page checksum version:\s*(\d+)\s*$", controldata, re.MULTILINE)
    if not m:
        raise ValueError("pg_controldata output has no 'Data page checksum version' line")
    return {"checksums": "on" if m.group(1) != "0" else "off"}


def write_outage_seconds(last_old_write: float | None, first_new_write: float | None) -> float | None:
    """Seconds between the last write the old major acknowledged and the first the new one did."""
    if last_old_write is None or first_new_write is None:
        return None
    if first_new_write < last_old_write:
        raise ValueError("the first write on the new major comes before the last on the old one")
    return round(first_new_write - last_old_write, 3)
