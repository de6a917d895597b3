"""Backup benchmark with real parts (no Kubernetes). Prints one JSON line.

One PostgreSQL 16 (unprivileged user, loopback) archiving WAL to an S3-compatible server (moto, loopback)
with the archive_command of pg_operator.backup, filled with pgbench data (scale 14 ≈ 210 MB). Per trial,
on the same data in the same run:
- barman-cloud-backup to S3, gzip and uncompressed (the command line of `base_backup_argv`);
- pg_basebackup to local disk, tar+gzip (-Ft -z) and plain (-Fp), as the reference without an object store;
- the S3 server's own ceiling: one boto3 multipart upload of 64 MB of random bytes (moto is a Python
  server on the same cores, so it bounds what barman-cloud can reach here);
- restore: barman-cloud-restore of the latest backup into a new directory, then PostgreSQL replays the
  archived WAL (restore_command) and promotes; both phases timed.
Figures are medians over the trials (default 3). Throughput = database bytes / seconds.

    .venv/bin/python bench/bench_backup.py [--scale 14] [--trials 3]
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
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

from backup_harness import Harness, Postgres  # noqa: E402

from pg_operator.backup.archiving import ArchiveSettings, archiving_parameters  # noqa: E402
from pg_operator.backup.barman import ObjectStore, backup_list_argv, backup_show_argv, base_backup_argv  # noqa: E402
from pg_operator.backup.catalog import backup_status  # noqa: E402
from pg_operator.backup.recovery import (  # noqa: E402
    RecoveryTarget,
    bootstrap_command,
    recovery_settings,
    source_env_names,
)

BUCKET = "bench"
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


def s3_put(h: Harness, size_mb: int = 64) -> float:
    """Seconds for one multipart upload of incompressible bytes with boto3: the store's own ceiling."""
    blob = h.workdir / "blob"
    blob.write_bytes(os.urandom(size_mb * MB))
    seconds, _ = timed(lambda: h.s3.client().upload_file(str(blob), BUCKET, "probe/blob"))
    blob.unlink()
    h.s3.client().delete_object(Bucket=BUCKET, Key="probe/blob")
    return seconds


def barman_backup(h: Harness, pg: Postgres, store: ObjectStore, name: str) -> tuple[float, int]:
    argv = base_backup_argv(store, name=name, host="127.0.0.1", port=pg.port, user="postgres")
    seconds, res = timed(lambda: h.barman(argv, timeout=1800))
    checked(res, "barman-cloud-backup")
    listed = json.loads(checked(h.barman(backup_list_argv(store)), "backup-list").stdout)["backups_list"]
    (entry,) = [b for b in listed if b.get("backup_name") == name]
    shown = json.loads(
        checked(h.barman(backup_show_argv(store, str(entry["backup_id"]))), "backup-show").stdout
    )
    assert backup_status(shown)["phase"] == "Completed"
    prefix = f"{store.prefix}base/{entry['backup_id']}/"
    pages = h.s3.client().get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix)
    return seconds, sum(o["Size"] for page in pages for o in page.get("Contents", []))


def pg_basebackup(pg: Postgres, target: Path, *fmt: str) -> float:
    seconds, res = timed(lambda: pg.run([pg.bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port),
                                         "-U", "postgres", "-D", str(target), "-c", "fast", *fmt],
                                        check=False))  # fmt: skip
    checked(res, "pg_basebackup")
    return seconds


def restore_latest(h: Harness, store: ObjectStore, name: str) -> tuple[Postgres, float, float]:
    """A new instance from the store's latest backup, replayed to the end of the archive and promoted
    (left running); returns it with the seconds of barman-cloud-restore and of the replay."""
    pg = h.postgres(name)
    pg.pgdata.parent.mkdir(parents=True)
    os.chown(pg.pgdata.parent, pg.user.pw_uid, pg.user.pw_gid)
    for variable, source_variable in source_env_names().items():
        pg.env[source_variable] = pg.env[variable]
    target = RecoveryTarget()
    # The bootstrap command Patroni would run: restore, then drop the source's archive settings.
    command = shlex.split(bootstrap_command(store, target, str(pg.pgdata), None))
    copy_s, res = timed(lambda: pg.run(command, check=False, timeout=1800))
    checked(res, "barman-cloud-restore")
    pg.configure({**pg.base_parameters(), **recovery_settings(store, target), "archive_mode": "off"})
    (pg.pgdata / "recovery.signal").touch()
    replay_s, _ = timed(lambda: pg.start(timeout=1800))
    return pg, copy_s, replay_s


def restore(h: Harness, store: ObjectStore, name: str) -> tuple[float, float, int]:
    pg, copy_s, replay_s = restore_latest(h, store, name)
    ((rows,),) = pg.query("SELECT count(*) FROM pgbench_accounts")
    pg.stop()
    shutil.rmtree(pg.pgdata.parent, ignore_errors=True)
    return copy_s, replay_s, int(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=14, help="pgbench scale (1 ≈ 15 MB)")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: PostgreSQL runs as a system user this script creates")

    workdir = Path(tempfile.mkdtemp(prefix="pgop-bench-backup-", dir="/var/tmp"))
    h = Harness(workdir)
    trials: dict[str, list[float]] = {k: [] for k in (
        "barman_gzip_s", "barman_none_s", "pg_basebackup_tar_gzip_s", "pg_basebackup_plain_s",
        "restore_copy_s", "restore_replay_s", "s3_put_64mb_s")}  # fmt: skip
    try:
        h.s3.client().create_bucket(Bucket=BUCKET)
        store = h.store(BUCKET, "bench-db")
        plain_store = h.store(BUCKET, "bench-db", compression="none")
        pg = h.postgres("bench-db")
        pg.initdb()
        pg.configure({**pg.base_parameters(), **archiving_parameters(ArchiveSettings(store)),
                      "max_wal_size": "1GB", "shared_buffers": "256MB"})  # fmt: skip
        pg.start()
        db_bytes = fill(h, pg, args.scale)
        ((accounts,),) = pg.query("SELECT count(*) FROM pgbench_accounts")
        stored_gzip = 0
        for i in range(args.trials):
            trials["s3_put_64mb_s"].append(s3_put(h))
            seconds, stored_gzip = barman_backup(h, pg, store, f"gzip-{i}")
            trials["barman_gzip_s"].append(seconds)
            seconds, _ = barman_backup(h, pg, plain_store, f"none-{i}")
            trials["barman_none_s"].append(seconds)
            for key, fmt in (
                ("pg_basebackup_tar_gzip_s", ("-Ft", "-z")),
                ("pg_basebackup_plain_s", ("-Fp",)),
            ):
                target = pg.pgdata.parent / f"basebackup-{i}"
                trials[key].append(pg_basebackup(pg, target, *fmt))
                shutil.rmtree(target)
            copy_s, replay_s, rows = restore(h, store, f"restore-{i}")
            assert rows == accounts, (rows, accounts)
            trials["restore_copy_s"].append(copy_s)
            trials["restore_replay_s"].append(replay_s)
        pg.stop()
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: round(statistics.median(v), 2) for k, v in trials.items()}
    db_mb = db_bytes / MB
    print(json.dumps({
        "bench": "backup",
        "trials": args.trials,
        "pgbench_scale": args.scale,
        "database_mb": round(db_mb, 1),
        "barman_cloud_backup_gzip_mb_s": round(db_mb / med["barman_gzip_s"], 1),
        "barman_cloud_backup_none_mb_s": round(db_mb / med["barman_none_s"], 1),
        "pg_basebackup_tar_gzip_mb_s": round(db_mb / med["pg_basebackup_tar_gzip_s"], 1),
        "pg_basebackup_plain_mb_s": round(db_mb / med["pg_basebackup_plain_s"], 1),
        "s3_server_put_mb_s": round(64 / med["s3_put_64mb_s"], 1),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "restore_total_s": round(med["restore_copy_s"] + med["restore_replay_s"], 2),
        "barman_gzip_stored_mb": round(stored_gzip / MB, 1),
        **med,
        "raw": trials,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
