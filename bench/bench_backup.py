"""Backup benchmark with real parts (no Kubernetes). Prints one JSON line.

One PostgreSQL 16 (unprivileged user, loopback) archiving WAL to an S3-compatible server (moto, loopback)
with the archive_command of pg_operator.backup, filled with pgbench data (scale 14 ≈ 210 MB). Per trial,
on the same data in the same run:
- barman-cloud-backup to S3 with each compression of `--compressions` (default gzip, snappy, bzip2 and
  none; the command line of `base_backup_argv`), its stored size summed over the objects in the store;
- pg_basebackup to local disk, tar+gzip (-Ft -z) and plain (-Fp), as the reference without an object store
  (its stored size: the bytes of the files it wrote);
- the S3 server's own ceiling: one boto3 multipart upload of 64 MB of random bytes (moto is a Python
  server on the same cores, so it bounds what barman-cloud can reach here);
- restore: barman-cloud-restore of the latest backup into a new directory, then PostgreSQL replays the
  archived WAL (restore_command) and promotes; both phases timed.
Figures are medians over the trials (default 3). Throughput = database bytes / seconds. `methods` gives,
for each, the median seconds, MB/s, stored MB, `speed_vs_pg_basebackup` (its seconds over it: pg_basebackup's
-Ft -z for the compressed ones, -Fp for the uncompressed ones) and `stored_vs_database`.

    .venv/bin/python bench/bench_backup.py [--scale 14] [--trials 3] [--compressions gzip,snappy,bzip2,none]
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


def pg_basebackup(pg: Postgres, target: Path, *fmt: str) -> tuple[float, int]:
    seconds, res = timed(lambda: pg.run([pg.bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port),
                                         "-U", "postgres", "-D", str(target), "-c", "fast", *fmt],
                                        check=False))  # fmt: skip
    checked(res, "pg_basebackup")
    return seconds, sum(f.stat().st_size for f in target.rglob("*") if f.is_file())


def method_figures(
    seconds: list[float], stored: list[int], db_mb: float, reference_s: float
) -> dict[str, Any]:
    median_s = statistics.median(seconds)
    stored_mb = statistics.median(stored) / MB
    return {"seconds": round(median_s, 2), "mb_s": round(db_mb / median_s, 1),
            "stored_mb": round(stored_mb, 1), "speed_vs_pg_basebackup": round(reference_s / median_s, 2),
            "stored_vs_database": round(stored_mb / db_mb, 3),
            "trials_s": [round(x, 2) for x in seconds]}  # fmt: skip


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
    parser.add_argument("--compressions", default="gzip,snappy,bzip2,none",
                        help="barman-cloud-backup compressions to measure, comma-separated")  # fmt: skip
    args = parser.parse_args()
    compressions = [c.strip() for c in args.compressions.split(",") if c.strip()]
    unknown = set(compressions) - {"gzip", "snappy", "bzip2", "none"}
    if unknown or not compressions:
        raise SystemExit(f"--compressions: unknown {sorted(unknown)}; choose from gzip, snappy, bzip2, none")
    if os.geteuid() != 0:
        raise SystemExit("run as root: PostgreSQL runs as a system user this script creates")

    workdir = Path(tempfile.mkdtemp(prefix="pgop-bench-backup-", dir="/var/tmp"))
    h = Harness(workdir)
    trials: dict[str, list[float]] = {k: [] for k in (
        *(f"barman_{c}_s" for c in compressions), "pg_basebackup_tar_gzip_s", "pg_basebackup_plain_s",
        "restore_copy_s", "restore_replay_s", "s3_put_64mb_s")}  # fmt: skip
    stored: dict[str, list[int]] = {k: [] for k in (
        *(f"barman_{c}" for c in compressions), "pg_basebackup_tar_gzip", "pg_basebackup_plain")}  # fmt: skip
    try:
        h.s3.client().create_bucket(Bucket=BUCKET)
        stores = {c: h.store(BUCKET, "bench-db", compression=c) for c in compressions}
        pg = h.postgres("bench-db")
        pg.initdb()
        archive = archiving_parameters(ArchiveSettings(h.store(BUCKET, "bench-db")))  # WAL: gzip
        pg.configure({**pg.base_parameters(), **archive, "max_wal_size": "1GB",
                      "shared_buffers": "256MB"})  # fmt: skip
        pg.start()
        db_bytes = fill(h, pg, args.scale)
        ((accounts,),) = pg.query("SELECT count(*) FROM pgbench_accounts")
        for i in range(args.trials):
            trials["s3_put_64mb_s"].append(s3_put(h))
            for c in compressions:
                seconds, size = barman_backup(h, pg, stores[c], f"{c}-{i}")
                trials[f"barman_{c}_s"].append(seconds)
                stored[f"barman_{c}"].append(size)
            for key, fmt in (
                ("pg_basebackup_tar_gzip", ("-Ft", "-z")),
                ("pg_basebackup_plain", ("-Fp",)),
            ):
                target = pg.pgdata.parent / f"basebackup-{i}"
                seconds, size = pg_basebackup(pg, target, *fmt)
                trials[f"{key}_s"].append(seconds)
                stored[key].append(size)
                shutil.rmtree(target)
            # The stores share one prefix: "latest" is the trial's last backup (the last compression).
            copy_s, replay_s, rows = restore(h, stores[compressions[-1]], f"restore-{i}")
            assert rows == accounts, (rows, accounts)
            trials["restore_copy_s"].append(copy_s)
            trials["restore_replay_s"].append(replay_s)
        pg.stop()
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: round(statistics.median(v), 2) for k, v in trials.items()}
    db_mb = db_bytes / MB
    tar_s, plain_s = med["pg_basebackup_tar_gzip_s"], med["pg_basebackup_plain_s"]
    methods = {
        f"barman_cloud_backup_{c}": method_figures(
            trials[f"barman_{c}_s"], stored[f"barman_{c}"], db_mb, plain_s if c == "none" else tar_s
        )
        for c in compressions
    }
    methods["pg_basebackup_tar_gzip"] = method_figures(
        trials["pg_basebackup_tar_gzip_s"], stored["pg_basebackup_tar_gzip"], db_mb, tar_s
    )
    methods["pg_basebackup_plain"] = method_figures(
        trials["pg_basebackup_plain_s"], stored["pg_basebackup_plain"], db_mb, plain_s
    )
    print(json.dumps({
        "bench": "backup",
        "trials": args.trials,
        "pgbench_scale": args.scale,
        "database_mb": round(db_mb, 1),
        "methods": methods,
        "s3_server_put_mb_s": round(64 / med["s3_put_64mb_s"], 1),
        "restored_from": compressions[-1],
        "restore_total_s": round(med["restore_copy_s"] + med["restore_replay_s"], 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        **med,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
