"""RPO with WAL archiving alone, measured with real parts (no Kubernetes). Prints one JSON line.

Per trial: a PostgreSQL 16 primary archiving with the archive_command of pg_operator.backup and the
given archive_timeout (the operator's default is 60 s) to moto (S3, with auth, loopback), a
barman-cloud base backup, then one writer committing a timestamped row at a steady rate (one transaction
each; the time every commit is acknowledged is remembered). After `--duration` seconds plus a random
part of archive_timeout (so the trials do not all stop at the same phase of the segment switches), the
primary's disk is destroyed: every process of the server is SIGKILLed and its data directory, pg_wal
included, is deleted. A new instance is restored from the store to the latest point (barman-cloud-restore,
then restore_command replay until the archive ends, then promotion), as bench_backup.py's restore does.

RPO = time of the last acknowledged commit - acknowledgement time of the newest row present in the
restored database (seconds); lost = acknowledged rows missing. Medians and max over the trials.

    .venv/bin/python bench/bench_backup_rpo.py [--archive-timeout 60] [--rate 20] [--duration 90] [--trials 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backup import Harness, Postgres, barman_backup, restore_latest

from pg_operator.backup.archiving import ArchiveSettings, archiving_parameters

BUCKET = "bench-rpo"


def descendants(pid: int) -> list[int]:
    """pid and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def destroy(pg: Postgres) -> None:
    """The disk is gone: freeze the server's whole process tree (archiver and a running archive_command
    included, so nothing more reaches the store), SIGKILL it, delete the data directory."""
    assert pg.proc is not None
    tree = descendants(pg.proc.pid)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    for pid in descendants(pg.proc.pid) + tree:  # anything forked between the two walks too
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pg.proc.wait(30)
    shutil.rmtree(pg.pgdata)


class Writer(threading.Thread):
    """One connection, one INSERT per transaction at a steady rate; acks[id] = acknowledgement time."""

    def __init__(self, pg: Postgres, rate: float) -> None:
        super().__init__(daemon=True)
        self.pg, self.rate = pg, rate
        self.acks: dict[int, float] = {}
        self.late = 0
        self.error = ""

    def run(self) -> None:
        try:
            with self.pg.connect() as conn:
                start = time.time()
                i = 0
                while True:
                    i += 1
                    conn.execute("INSERT INTO writes (id, sent) VALUES (%s, %s)", (i, time.time()))
                    self.acks[i] = time.time()
                    delay = start + i / self.rate - time.time()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        self.late += 1
        except Exception as exc:  # the server was killed under us: the expected end
            self.error = type(exc).__name__


def trial(h: Harness, index: int, args: argparse.Namespace, rng: random.Random) -> dict[str, float]:
    name = f"rpo-{args.archive_timeout}s-{index}"
    store = h.store(BUCKET, name)
    settings = ArchiveSettings(store, archive_timeout=f"{args.archive_timeout}s")
    pg = h.postgres(name)
    pg.initdb()
    pg.configure({**pg.base_parameters(), **archiving_parameters(settings)})
    pg.start()
    pg.query("CREATE TABLE writes (id bigint PRIMARY KEY, sent double precision NOT NULL)")
    barman_backup(h, pg, store, "base")
    run_s = args.duration + rng.uniform(0, args.archive_timeout)
    wal_sql = "SELECT wal_bytes::bigint FROM pg_stat_wal"
    ((wal_start,),) = pg.query(wal_sql)
    writer = Writer(pg, args.rate)
    writer.start()
    time.sleep(run_s)
    ((wal_end,),) = pg.query(wal_sql)  # WAL records written (stats lag ≤ 1 s), switch padding excluded
    ((archived,),) = pg.query("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
    destroy(pg)
    writer.join(30)
    acks = dict(writer.acks)
    last_id = max(acks)
    restored, copy_s, replay_s = restore_latest(h, store, f"{name}-restored")
    ((count, newest),) = restored.query("SELECT count(*), max(id) FROM writes")
    restored.stop()
    shutil.rmtree(restored.pgdata.parent, ignore_errors=True)
    newest = int(newest or 0)
    assert count == newest, (count, newest)  # one writer: what survives is a prefix
    assert newest <= last_id, (newest, last_id)  # nothing unacknowledged beyond the last ack
    lost_from = acks[newest] if newest else acks[1]
    return {
        "run_s": round(run_s, 1),
        "acknowledged": last_id,
        "lost_rows": last_id - newest,
        "rpo_s": round(acks[last_id] - lost_from, 2),
        "achieved_rate": round(last_id / (acks[last_id] - acks[1]), 1),
        "late_commits": writer.late,
        "wal_kb_per_s": round((wal_end - wal_start) / run_s / 1024, 1),
        "restore_s": round(copy_s + replay_s, 1),
        "last_archived_wal_before_kill": archived,
        "writer_end": writer.error,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive-timeout", type=int, default=60, help="seconds (operator default: 60)")
    parser.add_argument("--rate", type=float, default=20, help="commits per second")
    parser.add_argument("--duration", type=float, default=90, help="seconds of writes, at least")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: PostgreSQL runs as a system user this script creates")

    rng = random.Random(args.seed)
    load_start = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="pgop-bench-rpo-", dir="/var/tmp"))
    h = Harness(workdir)
    results = []
    try:
        h.s3.client().create_bucket(Bucket=BUCKET)
        for i in range(args.trials):
            results.append(trial(h, i, args, rng))
            print(json.dumps({"trial": i, **results[-1]}), file=sys.stderr, flush=True)
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)

    rpo = [r["rpo_s"] for r in results]
    lost = [r["lost_rows"] for r in results]
    print(json.dumps({
        "bench": "backup_rpo_archiving_only",
        "trials": args.trials,
        "archive_timeout_s": args.archive_timeout,
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "rpo_s_median": round(statistics.median(rpo), 2),
        "rpo_s_max": max(rpo),
        "lost_rows_median": statistics.median(lost),
        "lost_rows_max": max(lost),
        "restore_s_median": statistics.median(r["restore_s"] for r in results),
        "load_average_at_start": [round(x, 2) for x in load_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "raw": results,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
