"""The cost of one scrape of an instance's /metrics (bench/bench_scrape.py): scrapes from the host over
verified HTTPS, the endpoint's own figures and the CPU time of its PostgreSQL session."""

from __future__ import annotations

import re
import socket
import ssl
import statistics
import time
from pathlib import Path
from typing import Any

from harness.e2e_backup import superuser_sql
from harness.kube import get_json
from harness.local_cluster import Kube

CLOCK_TICKS = 100  # USER_HZ on Linux: /proc/<pid>/stat counts CPU time in 1/100 s


def https_get(ip: str, port: int, server_name: str, ca: Path) -> str:
    """GET /metrics from a pod by IP, verifying its certificate for `server_name` against the CA."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((ip, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as tls:  # fmt: skip
        tls.sendall(f"GET /metrics HTTP/1.0\r\nHost: {server_name}\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b"200 OK"), head[:200]
    return body.decode()


def backend_cpu_ticks(operator: Kube, ns: str, pod: str, pid: str) -> int:
    """utime + stime of a PostgreSQL backend (the endpoint's session), from the pod's /proc."""
    stat = operator.kubectl("exec", "-n", ns, pod, "-c", "postgres", "--", "cat", f"/proc/{pid}/stat").stdout
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def scrape_cost(operator: Kube, ns: str, monitored: str, pod: str, ca: Path, n: int = 20) -> dict[str, Any]:
    """n + 1 scrapes of one pod's /metrics from the host over verified HTTPS, nothing else scraping it: the
    first (which reads the database sizes, a minute having passed) on its own, then the n others: the
    client's wall time, the endpoint's own figures (its queries' wall time, its CPU time) and the CPU time
    of the endpoint's PostgreSQL session (from the pod's /proc)."""
    ip = get_json(operator, "pod", pod, "-n", ns)["status"]["podIP"]
    name = f"{monitored}-r.{ns}.svc"

    def figures(body: str) -> dict[str, float]:
        return {k: float(v) for k, v in re.findall(r"^(pg_exporter_\w+) (\S+)$", body, re.M)}

    first = figures(https_get(ip, 9187, name, ca))
    backend = superuser_sql(operator, ns, pod, "SELECT pid FROM pg_stat_activity WHERE application_name = "
                            "'pg-operator-metrics'")  # fmt: skip
    ticks_before = backend_cpu_ticks(operator, ns, pod, backend)
    walls: list[float] = []
    own: list[float] = []
    cpu: list[float] = []
    queries: set[int] = set()
    samples = 0
    for _ in range(n):
        started = time.perf_counter()
        body = https_get(ip, 9187, name, ca)
        walls.append(time.perf_counter() - started)
        got = figures(body)
        own.append(got["pg_exporter_last_scrape_duration_seconds"])
        cpu.append(got["pg_exporter_last_scrape_cpu_seconds"])
        queries.add(int(got["pg_exporter_last_scrape_queries"]))
        samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    backend_ms = (backend_cpu_ticks(operator, ns, pod, backend) - ticks_before) * 1000 / CLOCK_TICKS / n
    return {
        "with_sizes": {"queries": int(first["pg_exporter_last_scrape_queries"]),
                       "queries_wall_ms": round(first["pg_exporter_last_scrape_duration_seconds"] * 1000, 1),
                       "endpoint_cpu_ms": round(first["pg_exporter_last_scrape_cpu_seconds"] * 1000, 2)},
        "others": {"queries": sorted(queries),
                   "client_wall_ms_median": round(statistics.median(walls) * 1000, 1),
                   "queries_wall_ms_median": round(statistics.median(own) * 1000, 1),
                   "endpoint_cpu_ms_median": round(statistics.median(cpu) * 1000, 2),
                   "postgres_session_cpu_ms_mean": round(backend_ms, 2)},
        "samples": samples,
    }  # fmt: skip
