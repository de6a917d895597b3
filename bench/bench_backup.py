"""Backup benchmark with real parts (no Kubernetes). Prints one JSON line.

One PostgreSQL 16 (unprivileged user, loopback) archiving WAL to an S3-compatible server (moto, loopback)
with the archive_command of pg_operator.backup, filled with pgbench data (scale 68 ≈ 1 GiB). Per trial,
on the same data in the same run, like against like:
- barman-cloud-backup to S3 with each codec of `--codecs` (the command line of `base_backup_argv`, with
  `--jobs`), its stored size summed over the objects in the store;
- pg_basebackup to local disk in tar format without WAL (`-Ft -X none`: barman-cloud-backup leaves WAL
  to the archive too) with each of `--pg-basebackup`: gzip at level 9 (barman's tarfile gzip is level 9),
  gzip at its default level (`-z`, 6), client-lz4, client-zstd, none;
- the same work barman-cloud does, done the plain way, with each of `--streamed`: pg_basebackup writing
  that tar to its stdout (`-D -`), uploaded as it comes to the same store by boto3's multipart transfer
  (`upload_fileobj`, 8 MiB parts, 4 threads: what `aws s3 cp -` does). Local disk is the ceiling; this
  is the baseline that pays for the store as barman-cloud does;
- the order of all of them alternates: forwards in even trials, backwards in odd ones, each barman codec
  next to its pg_basebackup counterpart (gzip-gzip, lz4-lz4, snappy-lz4 as PostgreSQL has no snappy,
  bzip2-gzip, none-none);
- the S3 server's own ceiling: one boto3 multipart upload of 64 MB of random bytes (moto is a Python
  server on the same cores, so it bounds what barman-cloud can reach here);
- before the first trial, the fill's WAL is archived (else the first backup waits for that backlog);
- restore of each codec in `--restore`: barman-cloud-restore of that trial's backup into a new
  directory, then PostgreSQL replays the archived WAL (restore_command, WAL archived with
  `--wal-codec`) up to the backup's end LSN and promotes; both phases timed.
Figures are medians over the trials. Throughput = database MB / seconds. `pairs` gives, per barman
codec, its MB/s, its counterpart's, and `speed_vs_pg_basebackup` (barman's MB/s over pg_basebackup's),
and where its counterpart was also streamed, `speed_vs_streamed` (over pg_basebackup's to the store).

    .venv/bin/python bench/bench_backup.py [--scale 68] [--trials 3] [--codecs gzip,lz4,snappy,none]
        [--pg-basebackup gzip,gzip-default,lz4,zstd,none] [--streamed gzip,lz4,none] [--jobs N]
        [--restore lz4] [--wal-codec lz4]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness

from harness.local_postgres import Harness, Postgres  # noqa: E402
from harness.s3 import REGION  # noqa: E402
from pg_operator.api.backup import COMPRESSIONS  # noqa: E402
from pg_operator.backup.archiving import ArchiveSettings, archiving_parameters  # noqa: E402
from pg_operator.backup.barman import (  # noqa: E402
    BASE_BACKUP_JOBS,
    ObjectStore,
    backup_list_argv,
    backup_show_argv,
    base_backup_argv,
)
from pg_operator.backup.catalog import backup_status  # noqa: E402
from pg_operator.backup.recovery import (  # noqa: E402
    RecoveryTarget,
    bootstrap_command,
    recovery_settings,
    source_env_names,
)

# pg_basebackup's compressions, as its arguments after -Ft.
PG_BASEBACKUP: dict[str, tuple[str, ...]] = {
    "gzip": ("--compress=client-gzip:9",),
    "gzip-default": ("-z",),
    "lz4": ("--compress=client-lz4",),
    "zstd": ("--compress=client-zstd",),
    "none": (),
}
# Each barman-cloud codec's counterpart.
COUNTERPART = {"gzip": "gzip", "bzip2": "gzip", "lz4": "lz4", "snappy": "lz4", "none": "none"}
# Python modules barman-cloud needs per codec beyond the standard library, and the package giving each.
CODEC_MODULES = {"lz4": ("lz4.frame", "lz4>=4"), "snappy": ("snappy", "python-snappy>=0.7")}
BUCKET = "bench"
# The streamed baseline's uploader: stdin to one object, boto3's managed multipart transfer.
STREAM_UPLOAD = (
    "import sys, boto3\n"
    "from boto3.s3.transfer import TransferConfig\n"
    "boto3.client('s3', endpoint_url=sys.argv[1], region_name=sys.argv[2]).upload_fileobj(\n"
    "    sys.stdin.buffer, sys.argv[3], sys.argv[4],\n"
    "    Config=TransferConfig(multipart_chunksize=8 << 20, max_concurrency=4))\n"
)
MB = 1024 * 1024


def timed(fn: Any) -> tuple[float, Any]:
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def checked(res: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if res.returncode != 0:
        raise SystemExit(f"{what} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res


def fill(h: Harness, pg: Postgres, scale: int) -> int:
    env = {**os.environ, "LD_LIBRARY_PATH": str(h.pg_home / "lib"), "PGHOST": "127.0.0.1",
           "PGPORT": str(pg.port), "PGUSER": "postgres"}  # fmt: skip
    checked(subprocess.run([pg.bin("pgbench"), "-i", "-q", "-s", str(scale), "postgres"], env=env,
                           capture_output=True, text=True), "pgbench -i")  # fmt: skip
    pg.query("CHECKPOINT")
    ((size,),) = pg.query("SELECT sum(pg_database_size(datname))::bigint FROM pg_database")
    return int(size)


def archive_caught_up(pg: Postgres, timeout: float = 1800) -> None:
    """Wait until the WAL written so far is archived: otherwise the first backup also waits for the
    fill's backlog (pg_backup_stop waits for its last segment, archived after everything before it)."""
    ((segment,),) = pg.query("SELECT pg_walfile_name(pg_switch_wal())")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ((archived,),) = pg.query("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
        if archived >= segment:
            return
        time.sleep(1)
    raise SystemExit(f"WAL up to {segment} not archived within {timeout:.0f} s")


def s3_put(h: Harness, size_mb: int = 64) -> float:
    """Seconds for one multipart upload of incompressible bytes with boto3: the store's own ceiling."""
    blob = h.workdir / "blob"
    blob.write_bytes(os.urandom(size_mb * MB))
    seconds, _ = timed(lambda: h.s3.client().upload_file(str(blob), BUCKET, "probe/blob"))
    blob.unlink()
    h.s3.client().delete_object(Bucket=BUCKET, Key="probe/blob")
    return seconds


def ensure_codec_modules(h: Harness, codecs: list[str]) -> None:
    """The harness's barman venv has barman[cloud,snappy]; a codec's module it lacks is added to it (as
    the image installs it next to barman)."""
    python = str(h.barman_bin / "python")
    for codec in codecs:
        if codec not in CODEC_MODULES:
            continue
        module, package = CODEC_MODULES[codec]
        if subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode != 0:
            checked(subprocess.run([python, "-m", "pip", "install", "-q", package], capture_output=True,
                                   text=True), f"pip install {package}")  # fmt: skip


def barman_backup_done(
    h: Harness, pg: Postgres, store: ObjectStore, name: str, jobs: int | None = None
) -> tuple[float, int, dict[str, Any]]:
    """barman-cloud-backup as the operator runs it: seconds, stored bytes, and its status fields."""
    argv = base_backup_argv(store, name=name, host="127.0.0.1", port=pg.port, user="postgres",
                            jobs=BASE_BACKUP_JOBS if jobs is None else jobs)  # fmt: skip
    seconds, res = timed(lambda: h.barman(argv, timeout=3600))
    checked(res, "barman-cloud-backup")
    listed = json.loads(checked(h.barman(backup_list_argv(store)), "backup-list").stdout)["backups_list"]
    (entry,) = [b for b in listed if b.get("backup_name") == name]
    shown = json.loads(
        checked(h.barman(backup_show_argv(store, str(entry["backup_id"]))), "backup-show").stdout
    )
    status = backup_status(shown)
    assert status["phase"] == "Completed", status
    prefix = f"{store.prefix}base/{entry['backup_id']}/"
    pages = h.s3.client().get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix)
    return seconds, sum(o["Size"] for page in pages for o in page.get("Contents", [])), status


def barman_backup(h: Harness, pg: Postgres, store: ObjectStore, name: str) -> tuple[float, int]:
    seconds, size, _ = barman_backup_done(h, pg, store, name)
    return seconds, size


def pg_basebackup(pg: Postgres, target: Path, *fmt: str) -> tuple[float, int]:
    seconds, res = timed(lambda: pg.run([pg.bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port),
                                         "-U", "postgres", "-D", str(target), "-c", "fast", *fmt],
                                        check=False, timeout=3600))  # fmt: skip
    checked(res, "pg_basebackup")
    return seconds, sum(f.stat().st_size for f in target.rglob("*") if f.is_file())


def pg_basebackup_streamed(h: Harness, pg: Postgres, key: str, *fmt: str) -> tuple[float, int]:
    """pg_basebackup's tar on its stdout, piped into a multipart upload to the bench's bucket."""
    backup = shlex.join([pg.bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
                         "-D", "-", "-Ft", "-X", "none", "-c", "fast", *fmt])  # fmt: skip
    upload = shlex.join(
        [str(h.barman_bin / "python"), "-c", STREAM_UPLOAD, h.s3.endpoint, REGION, BUCKET, key]
    )
    seconds, res = timed(lambda: pg.run(["bash", "-c", f"set -o pipefail; {backup} | {upload}"], check=False,
                                        timeout=3600))  # fmt: skip
    checked(res, "pg_basebackup | upload")
    size = int(h.s3.client().head_object(Bucket=BUCKET, Key=key)["ContentLength"])
    h.s3.client().delete_object(Bucket=BUCKET, Key=key)
    return seconds, size


def figures(seconds: list[float], stored: list[int], db_mb: float) -> dict[str, Any]:
    median_s = statistics.median(seconds)
    stored_mb = statistics.median(stored) / MB
    return {"seconds": round(median_s, 2), "mb_s": round(db_mb / median_s, 1),
            "stored_mb": round(stored_mb, 1), "stored_vs_database": round(stored_mb / db_mb, 3),
            "trials_s": [round(x, 2) for x in seconds]}  # fmt: skip


def restore_backup(
    h: Harness, store: ObjectStore, name: str, target: RecoveryTarget
) -> tuple[Postgres, float, float]:
    """A new instance from a backup in the store, replayed to `target` and promoted (left running);
    returns it with the seconds of barman-cloud-restore and of the replay."""
    pg = h.postgres(name)
    pg.pgdata.parent.mkdir(parents=True)
    os.chown(pg.pgdata.parent, pg.user.pw_uid, pg.user.pw_gid)
    for variable, source_variable in source_env_names().items():
        pg.env[source_variable] = pg.env[variable]
    # The bootstrap command Patroni would run: restore, then drop the source's archive settings.
    command = shlex.split(bootstrap_command(store, target, str(pg.pgdata), None))
    copy_s, res = timed(lambda: pg.run(command, check=False, timeout=3600))
    checked(res, "barman-cloud-restore")
    pg.configure({**pg.base_parameters(), **recovery_settings(store, target), "archive_mode": "off"})
    (pg.pgdata / "recovery.signal").touch()
    replay_s, _ = timed(lambda: pg.start(timeout=3600))
    return pg, copy_s, replay_s


def restore_latest(h: Harness, store: ObjectStore, name: str) -> tuple[Postgres, float, float]:
    """The store's latest backup, replayed to the end of the archive."""
    return restore_backup(h, store, name, RecoveryTarget())


def restore(h: Harness, store: ObjectStore, name: str, status: dict[str, Any]) -> tuple[float, float, int]:
    """One backup (by its ID) restored and replayed up to its own end LSN: the WAL every restore of it
    replays, whatever came after."""
    target = RecoveryTarget(lsn=status["endLSN"], backup_id=status["backupID"])
    pg, copy_s, replay_s = restore_backup(h, store, name, target)
    ((rows,),) = pg.query("SELECT count(*) FROM pgbench_accounts")
    pg.stop()
    shutil.rmtree(pg.pgdata.parent, ignore_errors=True)
    return copy_s, replay_s, int(rows)


def codec_list(value: str, known: tuple[str, ...] | list[str], flag: str) -> list[str]:
    chosen = [c.strip() for c in value.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"{flag}: unknown {unknown}; choose from {', '.join(known)}")
    return chosen


def trial_order(
    codecs: list[str], variants: list[str], trial: int, streamed: list[str] | None = None
) -> list[tuple[str, str]]:
    """Each barman codec next to its counterparts (streamed to the store, then to local disk), then the
    variants no codec claimed; backwards in odd trials so neither side always runs first (page cache, a
    busy neighbour)."""
    streamed = streamed or []
    steps: list[tuple[str, str]] = []
    for codec in codecs:
        steps.append(("barman", codec))
        for side, chosen in (("stream", streamed), ("pg", variants)):
            if COUNTERPART[codec] in chosen and (side, COUNTERPART[codec]) not in steps:
                steps.append((side, COUNTERPART[codec]))
    steps += [("stream", v) for v in streamed if ("stream", v) not in steps]
    steps += [("pg", v) for v in variants if ("pg", v) not in steps]
    return steps[::-1] if trial % 2 else steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=68, help="pgbench scale (1 ≈ 15 MB)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--codecs", default="gzip,lz4,snappy,none",
                        help="barman-cloud-backup compressions, comma-separated")  # fmt: skip
    parser.add_argument("--pg-basebackup", default="gzip,gzip-default,lz4,zstd,none",
                        help=f"pg_basebackup compressions, of {', '.join(PG_BASEBACKUP)}")  # fmt: skip
    parser.add_argument("--streamed", default="lz4,none",
                        help="pg_basebackup compressions also piped into an upload to the store")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None,
                        help="barman-cloud-backup upload jobs (default: base_backup_argv's)")  # fmt: skip
    parser.add_argument("--restore", default="lz4", help="codecs whose backup is restored each trial")
    parser.add_argument("--wal-codec", default="lz4", help="compression of the archived WAL")
    args = parser.parse_args()
    codecs = codec_list(args.codecs, COMPRESSIONS, "--codecs")
    variants = codec_list(args.pg_basebackup, list(PG_BASEBACKUP), "--pg-basebackup")
    streamed = codec_list(args.streamed, list(PG_BASEBACKUP), "--streamed")
    restores = codec_list(args.restore, codecs, "--restore")
    wal_codec = args.wal_codec
    if wal_codec not in COMPRESSIONS:
        raise SystemExit(f"--wal-codec: {wal_codec!r} is not one of {', '.join(COMPRESSIONS)}")
    if os.geteuid() != 0:
        raise SystemExit("run as root: PostgreSQL runs as a system user this script creates")

    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="pgop-bench-backup-", dir="/var/tmp"))
    h = Harness(workdir)
    seconds: dict[str, list[float]] = {}
    stored: dict[str, list[int]] = {}
    phases: dict[str, list[float]] = {"s3_put_64mb_s": []}
    try:
        ensure_codec_modules(h, [*codecs, wal_codec])
        h.s3.client().create_bucket(Bucket=BUCKET)
        stores = {c: h.store(BUCKET, "bench-db", compression=c) for c in codecs}
        pg = h.postgres("bench-db")
        pg.initdb()
        archive = archiving_parameters(ArchiveSettings(h.store(BUCKET, "bench-db", compression=wal_codec)))
        pg.configure({**pg.base_parameters(), **archive, "max_wal_size": "1GB",
                      "shared_buffers": "256MB"})  # fmt: skip
        pg.start()
        db_bytes = fill(h, pg, args.scale)
        ((accounts,),) = pg.query("SELECT count(*) FROM pgbench_accounts")
        archive_caught_up(pg)
        for i in range(args.trials):
            phases["s3_put_64mb_s"].append(s3_put(h))
            done: dict[str, dict[str, Any]] = {}
            for side, codec in trial_order(codecs, variants, i, streamed):
                if side == "barman":
                    key = f"barman_cloud_backup_{codec}"
                    name = f"{codec}-{i}"
                    took, size, done[codec] = barman_backup_done(h, pg, stores[codec], name, args.jobs)
                elif side == "stream":
                    key = f"pg_basebackup_streamed_{codec}"
                    took, size = pg_basebackup_streamed(h, pg, f"streamed/{codec}-{i}.tar",
                                                        *PG_BASEBACKUP[codec])  # fmt: skip
                else:
                    key = f"pg_basebackup_tar_{codec}"
                    target = pg.pgdata.parent / f"basebackup-{i}"
                    took, size = pg_basebackup(pg, target, "-Ft", "-X", "none", *PG_BASEBACKUP[codec])
                    shutil.rmtree(target)
                seconds.setdefault(key, []).append(took)
                stored.setdefault(key, []).append(size)
            for codec in restores:
                copy_s, replay_s, rows = restore(h, stores[codec], f"restore-{codec}-{i}", done[codec])
                assert rows == accounts, (rows, accounts)
                phases.setdefault(f"restore_{codec}_copy_s", []).append(copy_s)
                phases.setdefault(f"restore_{codec}_replay_s", []).append(replay_s)
        pg.stop()
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)

    db_mb = db_bytes / MB
    methods = {key: figures(seconds[key], stored[key], db_mb) for key in seconds}
    pairs = {}
    for codec in codecs:
        mine, theirs = f"barman_cloud_backup_{codec}", f"pg_basebackup_tar_{COUNTERPART[codec]}"
        streamed_key = f"pg_basebackup_streamed_{COUNTERPART[codec]}"
        pair: dict[str, float] = {}
        if theirs in methods:
            pair = {
                "barman_mb_s": methods[mine]["mb_s"],
                "pg_basebackup_mb_s": methods[theirs]["mb_s"],
                "speed_vs_pg_basebackup": round(methods[mine]["mb_s"] / methods[theirs]["mb_s"], 2),
            }
        if streamed_key in methods:
            pair |= {
                "barman_mb_s": methods[mine]["mb_s"],
                "pg_basebackup_streamed_mb_s": methods[streamed_key]["mb_s"],
                "speed_vs_streamed": round(methods[mine]["mb_s"] / methods[streamed_key]["mb_s"], 2),
            }
        if pair:
            pairs[f"{codec}_vs_{COUNTERPART[codec]}"] = pair
    med = {k: round(statistics.median(v), 2) for k, v in phases.items()}
    restored = {
        c: {"copy_s": med[f"restore_{c}_copy_s"], "replay_s": med[f"restore_{c}_replay_s"],
            "total_s": round(med[f"restore_{c}_copy_s"] + med[f"restore_{c}_replay_s"], 2),
            "trials_copy_s": [round(x, 2) for x in phases[f"restore_{c}_copy_s"]],
            "trials_replay_s": [round(x, 2) for x in phases[f"restore_{c}_replay_s"]]}
        for c in restores
    }  # fmt: skip
    print(json.dumps({
        "bench": "backup",
        "trials": args.trials,
        "pgbench_scale": args.scale,
        "database_mb": round(db_mb, 1),
        "barman_jobs": BASE_BACKUP_JOBS if args.jobs is None else args.jobs,
        "wal_codec": wal_codec,
        "pairs": pairs,
        "methods": methods,
        "s3_server_put_mb_s": round(64 / med["s3_put_64mb_s"], 1),
        "restore": restored,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
