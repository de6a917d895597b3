"""Replicas through an in-place major upgrade without a re-clone, where that is safe (docs/major-upgrades.md).

pg_upgrade's own procedure for standbys: the primary stops first, each standby stops once it has replayed
the primary's shutdown checkpoint, and a standby whose `Latest checkpoint location` equals the primary's
holds the same data. It then gets the primary's *new* cluster the way `rsync --hard-links --size-only`
would give it: every file pg_upgrade did not link (the new catalogs, pg_xact, the new WAL: megabytes) is
copied from the primary, and every file it linked becomes a hard link to the standby's own copy of the old
file. Nothing of the size of the data crosses the network.

Here the copy is a tar stream from the primary's container into each replica's, relayed by the operator's
pod exec (no new port, no new credential), before the new major first starts on the primary (it changes
files the old and new clusters share). A replica whose checkpoint differs, whose seed fails, or whose old
files lack one the primary linked (other than an unlogged relation's forks, which a standby never has) is
re-cloned instead. Every step leaves the replica's old data directory intact until the new one is whole.

Pure builders (shell scripts run as the postgres user) and readers of what they print. May import `api`
and `orchestration.major_upgrade`; never `specs` or `controller`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pg_operator.orchestration.major_upgrade import Layout

# The manifest of hard links travels as the stream's first member, under a name no data directory has.
LINKS_MEMBER: Final = "pgop-seed-links"
# A replica's recorded checkpoint when its data directory already holds the new major (a retried step).
SEEDED: Final = "seeded"


# pg_controldata's lines the stops report (sed script).
_REPORT: Final = "s/^Latest checkpoint location: */checkpoint: /p;s/^Database cluster state: */state: /p"


def _vars(layout: Layout, **extra: str) -> str:
    values = {"OLD_BIN": layout.old_bin, "PGDATA": layout.pgdata, "WORK": layout.work, "REPORT": _REPORT,
              **extra}  # fmt: skip
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


# The primary's stop: a fast shutdown (its checkpoint is the last record the replicas must replay), then
# that checkpoint's location. A retried step finds the data already upgraded: the location the upgrade
# recorded before it ran.
_STOP_PRIMARY = r"""
set -u
"$OLD_BIN/pg_ctl" stop -D "$PGDATA" -m fast -w -t 120 >/dev/null 2>&1 || true
if [ "$(cat "$PGDATA/PG_VERSION" 2>/dev/null)" = "$OLD_MAJOR" ]; then
  "$OLD_BIN/pg_controldata" "$PGDATA" | sed -n "$REPORT"
elif [ -f "$WORK/old-checkpoint" ]; then
  echo "checkpoint: $(cat "$WORK/old-checkpoint")"
  echo "state: shut down"
fi
"""

# A replica's stop: wait (at most $WAIT s) until it has replayed past the primary's shutdown checkpoint,
# stop it, and report the checkpoint its own shutdown recorded.
_STOP_REPLICA = r"""
set -u
have=$(cat "$PGDATA/PG_VERSION" 2>/dev/null || true)
if [ "$have" = "$NEW_MAJOR" ]; then echo "checkpoint: seeded"; exit 0; fi
if [ -n "$CHECKPOINT" ]; then
  i=0
  while [ "$i" -lt $((WAIT * 5)) ]; do
    ok=$($PSQL -c "select coalesce(pg_last_wal_replay_lsn() > '$CHECKPOINT'::pg_lsn, false)" 2>/dev/null) \
      || ok=
    [ "$ok" = t ] && break
    [ "$ok" = "" ] && [ ! -f "$PGDATA/postmaster.pid" ] && break
    i=$((i + 1)); sleep 0.2
  done
fi
"$OLD_BIN/pg_ctl" stop -D "$PGDATA" -m fast -w -t 120 >/dev/null 2>&1 || true
[ "$have" = "$OLD_MAJOR" ] || { echo "state: no data of PostgreSQL $OLD_MAJOR"; exit 0; }
"$OLD_BIN/pg_controldata" "$PGDATA" | sed -n "$REPORT"
"""

# On the primary, after the upgrade: the new data directory as a gzipped tar stream on stdout — the
# manifest of linked files ("new-path old-path" per line, paired by inode with the kept old directory)
# first, then every directory and every file the old cluster does not share. A count on stderr.
_SOURCE = r"""
set -eu
KEPT="$WORK/pgdata-$OLD_MAJOR" S="$WORK/seed"
[ "$(cat "$PGDATA/PG_VERSION")" = "$NEW_MAJOR" ] || { echo "PGDATA is not $NEW_MAJOR" >&2; exit 1; }
rm -rf "$S" && mkdir -p "$S"
cd "$PGDATA"
find "$KEPT" -type f -links +1 -printf '%i %P\n' | LC_ALL=C sort -k1,1 >"$S/old"
find . -type f -links +1 -printf '%i %P\n' | LC_ALL=C sort -k1,1 >"$S/new"
if grep -q '[[:space:]].*[[:space:]]' "$S/old" "$S/new"; then
  echo "a linked path holds a space" >&2; exit 1
fi
LC_ALL=C join -j 1 -o 2.2,1.2 "$S/old" "$S/new" >"$S/$LINKS"
LC_ALL=C join -j 1 -v 2 -o 2.2 "$S/old" "$S/new" >"$S/unpaired"
{ find . -mindepth 1 \( -type d -o -type l -o \( -type f -links 1 \) \) -printf '%P\n'
  cat "$S/unpaired"; } >"$S/files"
bytes=$(find . -type f -links 1 -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
echo "seed source: entries=$(wc -l <"$S/files") links=$(wc -l <"$S/$LINKS") bytes=$bytes" >&2
# gzip -1: the new WAL segment is mostly zeros and catalogs shrink to a quarter, for little CPU.
# (sh has no pipefail: tar's status is carried out of the pipe by hand.)
{ rc=0; tar -c -f - --no-recursion -C "$S" "$LINKS" -C "$PGDATA" -T "$S/files" || rc=$?
  echo $rc >"$S/rc"; } | gzip -1
exit "$(cat "$S/rc")"
"""

# On a stopped replica whose checkpoint matched: the stream from stdin into a new directory, the linked files
# as hard links to the replica's own old ones, then the swap. Any failure leaves the old directory in place.
_SINK = r"""
set -u
NEW="$WORK/pgdata-seeded" KEPT="$WORK/pgdata-$OLD_MAJOR"
fail() {
  echo "replica seed failed: $*" >&2
  if [ ! -d "$PGDATA" ] && [ -d "$KEPT" ]; then mv "$KEPT" "$PGDATA"; fi
  rm -rf "$NEW"
  exit 1
}
have=$(cat "$PGDATA/PG_VERSION" 2>/dev/null || true)
if [ "$have" = "$NEW_MAJOR" ]; then cat >/dev/null; echo "seeded: already"; exit 0; fi
[ "$have" = "$OLD_MAJOR" ] || { cat >/dev/null; fail "PGDATA holds no PostgreSQL $OLD_MAJOR"; }
[ -f "$PGDATA/postmaster.pid" ] && { cat >/dev/null; fail "PostgreSQL still runs"; }
mine=$("$OLD_BIN/pg_controldata" "$PGDATA" | sed -n 's/^Latest checkpoint location: *//p')
[ "$mine" = "$CHECKPOINT" ] || { cat >/dev/null; fail "checkpoint $mine is not the primary's $CHECKPOINT"; }
mkdir -p "$WORK" && rm -rf "$NEW" && mkdir -m 700 "$NEW" || { cat >/dev/null; fail "no work directory"; }
gzip -dc | tar -x -f - -C "$NEW" || fail "the stream from the primary broke off"
[ -f "$NEW/$LINKS" ] || fail "the stream from the primary broke off"
mv "$NEW/$LINKS" "$WORK/seed-links" || fail "moving the manifest aside"
[ "$(cat "$NEW/PG_VERSION" 2>/dev/null)" = "$NEW_MAJOR" ] && [ -f "$NEW/global/pg_control" ] \
  || fail "the stream held no PostgreSQL $NEW_MAJOR cluster"
cd "$PGDATA" || fail "no PGDATA"
find . -type f -printf '%P\n' | LC_ALL=C sort >"$WORK/seed-have"
awk '$1 == $2 { print $2 }' "$WORK/seed-links" | LC_ALL=C sort >"$WORK/seed-same"
# Linked under the same path (every relation since PostgreSQL 15 keeps its file name): one cp per batch.
LC_ALL=C comm -12 "$WORK/seed-same" "$WORK/seed-have" | xargs -r -d '\n' cp --parents --link -t "$NEW" \
  || fail "linking the replica's own files"
linked=$(LC_ALL=C comm -12 "$WORK/seed-same" "$WORK/seed-have" | wc -l)
# A file the primary linked that this replica lacks: an unlogged relation's fork is expected (a standby has
# only its init fork, and recreates the rest on promotion); anything else means the data differs.
skipped=0
check_missing() {
  base=${1##*/}
  rel="${1%/*}/${base%%[._]*}"
  [ -f "$PGDATA/${rel}_init" ] || fail "the replica lacks $1, which the primary has"
  skipped=$((skipped + 1))
}
for f in $(LC_ALL=C comm -23 "$WORK/seed-same" "$WORK/seed-have"); do check_missing "$f"; done
while read -r new old; do
  [ "$new" = "$old" ] && continue
  if [ -f "$PGDATA/$old" ]; then
    mkdir -p "$NEW/$(dirname "$new")" && ln "$PGDATA/$old" "$NEW/$new" || fail "linking $old"
    linked=$((linked + 1))
  else
    check_missing "$old"
  fi
done <"$WORK/seed-links"
files=$(cd "$NEW" && find . -mindepth 1 | wc -l)
mv "$PGDATA" "$KEPT" || fail "moving the old data directory aside"
mv "$NEW" "$PGDATA" || fail "moving the new data directory into place"
sync -f "$PGDATA" 2>/dev/null || true
echo "seeded: entries=$files linked=$linked unlogged_skipped=$skipped"
"""


def stop_primary_script(layout: Layout, old_major: str) -> str:
    """Stop the primary (fast) and print `checkpoint: <lsn>` and `state: <cluster state>`."""
    return _vars(layout, OLD_MAJOR=old_major) + _STOP_PRIMARY


def stop_replica_script(layout: Layout, old_major: str, new_major: str, checkpoint: str | None, psql: str,
                        wait_seconds: int) -> str:  # fmt: skip
    """Wait at most `wait_seconds` until the replica replayed past the primary's shutdown `checkpoint`, stop
    it, print its own `checkpoint:` (or `checkpoint: seeded` once it holds the new major)."""
    extra = {"OLD_MAJOR": old_major, "NEW_MAJOR": new_major, "CHECKPOINT": checkpoint or "", "PSQL": psql,
             "WAIT": str(int(wait_seconds))}  # fmt: skip
    return _vars(layout, **extra) + _STOP_REPLICA


def source_script(layout: Layout, old_major: str, new_major: str) -> str:
    """On the upgraded primary (before its first start): the seed as a tar stream on stdout."""
    extra = {"OLD_MAJOR": old_major, "NEW_MAJOR": new_major, "LINKS": LINKS_MEMBER}
    return _vars(layout, **extra) + _SOURCE


def sink_script(layout: Layout, old_major: str, new_major: str, checkpoint: str) -> str:
    """On a stopped replica: the seed from stdin, hard links to its own files, the directories swapped."""
    extra = {"OLD_MAJOR": old_major, "NEW_MAJOR": new_major, "CHECKPOINT": checkpoint, "LINKS": LINKS_MEMBER}
    return _vars(layout, **extra) + _SINK


# --- reading what the scripts printed ----------------------------------------------------------------

_LSN = re.compile(r"^[0-9A-F]{1,8}/[0-9A-F]{1,8}$")


def reported(output: str) -> dict[str, str]:
    """`key: value` lines of a step's output."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.strip() in ("checkpoint", "state", "seeded", "seed source"):
            found[key.strip()] = value.strip()
    return found


def checkpoint_of(output: str) -> str | None:
    """The checkpoint location a stop printed, if it is one (or SEEDED)."""
    value = reported(output).get("checkpoint")
    if value == SEEDED or (value is not None and _LSN.match(value)):
        return value
    return None


@dataclass(frozen=True)
class ReplicaPlan:
    """For each replica: follow by seeding (its checkpoint matched) or re-clone, with why."""

    seed: tuple[str, ...]
    reclone: Mapping[str, str]


def plan(primary_checkpoint: str | None, replica_outputs: Mapping[str, str | None]) -> ReplicaPlan:
    """Which replicas may be seeded: those whose shutdown checkpoint is the primary's (or that already hold
    the new major). `replica_outputs`: each replica's stop output, None when the stop could not run."""
    seed: list[str] = []
    reclone: dict[str, str] = {}
    for name, output in sorted(replica_outputs.items()):
        mine = checkpoint_of(output) if output is not None else None
        if mine == SEEDED:
            seed.append(name)
        elif primary_checkpoint is None:
            reclone[name] = "the primary's shutdown checkpoint is unknown"
        elif output is None:
            reclone[name] = "its stop could not be run"
        elif mine is None:
            reclone[name] = "its checkpoint could not be read"
        elif mine != primary_checkpoint:
            reclone[name] = f"its checkpoint {mine} is not the primary's {primary_checkpoint}"
        else:
            seed.append(name)
    return ReplicaPlan(tuple(seed), reclone)


def seeded(output: str) -> bool:
    """Whether a sink said it swapped in the new cluster (or found it done)."""
    return "seeded" in reported(output)


def _counts(value: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (value or "").split():
        key, _, number = item.partition("=")
        if number.isdigit():
            out[key] = int(number)
    return out


def seed_failure(source_status: int, source_stderr: str, sink: object) -> str | None:
    """Why a replica's seed cannot be trusted, or None: the source must have exited 0, the sink (an
    ExecResult-like object with `exit_status`, `stdout`, `stderr`, or an error) must have swapped, and the
    sink must hold every entry the source sent plus one hard link for each linked file it had."""
    if source_status != 0:
        return f"the primary's stream failed: {source_stderr.strip()[-200:] or f'exit {source_status}'}"
    status = getattr(sink, "exit_status", None)
    if status is None:
        return f"its end of the stream failed: {str(sink)[-200:]}"
    stdout, stderr = str(getattr(sink, "stdout", "")), str(getattr(sink, "stderr", ""))
    if status != 0 or not seeded(stdout):
        return stderr.strip().splitlines()[-1][-200:] if stderr.strip() else f"its end exited {status}"
    got = _counts(reported(stdout).get("seeded"))
    if not got:
        return None  # already seeded by an earlier attempt
    sent = _counts(reported(source_stderr).get("seed source"))
    want = sent.get("entries", -1) + sent.get("links", -1) - got.get("unlogged_skipped", 0)
    accounted = got.get("linked", -1) + got.get("unlogged_skipped", 0)
    if got.get("entries") != want or accounted != sent.get("links"):
        return f"it holds {got.get('entries')} entries, not the {want} the primary sent and linked"
    return None


def summary(linked: list[str], recloned: Mapping[str, str]) -> str:
    """One sentence for an Event and the status: which replicas follow how."""
    parts = []
    if linked:
        names = ", ".join(sorted(linked))
        parts.append(f"{names} keep their data (the new catalog copied, the data files hard-linked)")
    for name, why in sorted(recloned.items()):
        parts.append(f"{name} is re-cloned ({why})")
    return "; ".join(parts) if parts else "no replicas"
