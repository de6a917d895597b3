"""What TLS costs, against the same server without it, in one run. Prints one JSON line.

One PostgreSQL 16 (loopback, unprivileged user) with the operator's settings for TLS: a server certificate
issued by a cluster CA (pg_operator.specs.tls), `ssl = on`, TLS 1.2 at least, scram-sha-256. Its pg_hba
admits the benchmark's role with and without TLS (the operator's rejects the latter; here it is the
baseline). pgbench's select-only transaction (one indexed read of pgbench_accounts), two workloads:
- `connect`: a new connection for every transaction (pgbench -C), as an application without a pool:
  connections per second, the average connection time pgbench reports, transaction latency p50/p99;
- `pooled`: the same transactions on connections kept open (an application's pool): transactions per
  second, latency p50/p99.
Each workload runs with TLS (`sslmode=verify-full` against the CA, as the app Secret's URIs ask) and
without (`sslmode=disable`), the order alternating between rounds; figures are medians over the rounds.

    .venv/bin/python bench/bench_tls.py [--seconds 10] [--rounds 4] [--clients 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness

from harness.local_postgres import Postgres, postgresql_16, run_user  # noqa: E402
from harness.net import free_port  # noqa: E402
from harness.objects import cluster_model  # noqa: E402
from pg_operator.specs.tls import issue_server, new_ca  # noqa: E402

PASSWORD = "bench-password-0123456789"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(work: Path) -> tuple[Postgres, Path]:
    user = run_user()
    home = postgresql_16()
    env = {"PATH": f"{home / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(home / "lib"), "LANG": "C.UTF-8",
           "HOME": "/nonexistent"}  # fmt: skip
    pg = Postgres("tls", work / "tls" / "pgdata", free_port(), home, user, env)
    pg.initdb()
    now = dt.datetime.now(dt.UTC)
    cluster = cluster_model("bench-db", "bench")
    ca = new_ca(cluster, now)
    server = issue_server(cluster, ca, now)
    files = (("server.crt", server.cert_pem), ("server.key", server.key_pem), ("ca.crt", ca.cert_pem))
    for name, content in files:
        path = pg.pgdata / name
        path.write_bytes(content)
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o600)
    ca_file = work / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    ca_file.chmod(0o644)
    (pg.pgdata / "pg_hba.conf").write_text(
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"  # the harness's own readiness check
        "hostssl all bench 127.0.0.1/32 scram-sha-256\n"
        "hostnossl all bench 127.0.0.1/32 scram-sha-256\n"
    )
    pg.configure({**pg.base_parameters(), "ssl": "on", "ssl_cert_file": "server.crt",
                  "ssl_key_file": "server.key", "ssl_ca_file": "ca.crt",
                  "ssl_min_protocol_version": "TLSv1.2",
                  "password_encryption": "scram-sha-256", "max_connections": "100",
                  "shared_buffers": "128MB"})  # fmt: skip
    pg.start()
    pg.query(f"CREATE ROLE bench LOGIN PASSWORD '{PASSWORD}'")
    pg.query("CREATE DATABASE bench OWNER bench")
    pg.run([pg.bin("pgbench"), "-i", "-q", "-s", "2", "-h", str(pg.socket_dir), "-p", str(pg.port),
            "-U", "bench", "bench"])  # fmt: skip
    return pg, ca_file


SUMMARY = {
    "tps": re.compile(r"^tps = ([0-9.]+)", re.M),
    "connection_ms": re.compile(r"average connection time = ([0-9.]+) ms", re.M),
    "failed": re.compile(r"number of failed transactions: ([0-9]+)", re.M),
}


def run(pg: Postgres, logs: Path, ca: Path, *, tls: bool, connect: bool, seconds: int, clients: int,
        tag: str) -> dict[str, Any]:  # fmt: skip
    prefix = logs / tag
    argv = [pg.bin("pgbench"), "-n", "-S", "-T", str(seconds), "-c", str(clients), "-j", "1", "-l",
            f"--log-prefix={prefix}", "-h", "localhost", "-p", str(pg.port), "-U", "bench",
            "bench"]  # fmt: skip
    if connect:
        argv.insert(1, "-C")
    env = {
        "PGPASSWORD": PASSWORD,
        "PGHOSTADDR": "127.0.0.1",
        **({"PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(ca)} if tls else {"PGSSLMODE": "disable"}),
    }
    out = pg.run(argv, env=env, timeout=seconds * 4 + 60).stdout
    latencies = []
    for file in logs.glob(f"{tag}.*"):
        for line in file.read_text().splitlines():
            latencies.append(int(line.split()[2]) / 1000.0)  # microseconds → ms
        file.unlink()
    figures: dict[str, Any] = {k: float(m.group(1)) for k, p in SUMMARY.items() if (m := p.search(out))}
    figures.update(transactions=len(latencies), p50_ms=round(percentile(latencies, 0.50), 3),
                   p99_ms=round(percentile(latencies, 0.99), 3))  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        pg, ca = start_server(work)
        logs = work / "logs"
        logs.mkdir()
        user = run_user()
        os.chown(logs, user.pw_uid, user.pw_gid)
        samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
        try:
            for rnd in range(args.rounds):
                order = (True, False) if rnd % 2 == 0 else (False, True)
                for connect in (True, False):
                    for tls in order:
                        key = ("connect" if connect else "pooled", "tls" if tls else "plain")
                        samples.setdefault(key, []).append(run(
                            pg, logs, ca, tls=tls, connect=connect, seconds=args.seconds,
                            clients=args.clients, tag=f"r{rnd}-{key[0]}-{key[1]}"))  # fmt: skip
        finally:
            pg.stop()

    def median(key: tuple[str, str], field: str) -> float | None:
        values = [s[field] for s in samples[key] if field in s]
        return round(statistics.median(values), 3) if values else None

    result: dict[str, Any] = {
        "measure": "tls_cost",
        "seconds": args.seconds,
        "rounds": args.rounds,
        "clients": args.clients,
    }
    for workload in ("connect", "pooled"):
        fields = ("tps", "connection_ms", "p50_ms", "p99_ms")
        part: dict[str, Any] = {mode: {f: median((workload, mode), f) for f in fields}
                                for mode in ("tls", "plain")}  # fmt: skip
        runs = [s for m in ("tls", "plain") for s in samples[(workload, m)]]
        part["failed"] = sum(int(s.get("failed", 0)) for s in runs)
        tls_tps, plain_tps = part["tls"]["tps"], part["plain"]["tps"]
        part["tls_throughput_vs_plain"] = round(tls_tps / plain_tps, 3) if tls_tps and plain_tps else None
        result[workload] = part
    result["load_avg"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
