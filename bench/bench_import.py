"""spec.bootstrap.import's throughput against a plain dump and restore of the same data on the same
machine, sequential and with 2 jobs, on the full profile: one JSON line.

A PostgreSQL 15 source pod (tests/harness/import_source.py) is seeded with `--rows` rows (a table with a
primary key and a secondary index, plus a narrower one). For each degree of parallelism (1, 2):
- `import`: a new single-instance 17 cluster importing the database (`jobs: N`); the time is that of the
  import Job's pod, from the dump container's start to the restore container's end (the containers'
  own timestamps, 1 s resolution);
- `plain`: a pod of the same image, in the same namespace, running `pg_dump -Fc | pg_restore` (jobs 1)
  or `pg_dump -Fd -j N` then `pg_restore -j N` (jobs 2) from the same source into a new database of the
  same cluster, timed the same way.
The ratio import / plain is the operator's cost beyond the dump and restore themselves (none is
expected: the Job runs the same commands). Each figure with the data's size; the load average.

    python3 localkube/cluster.py up full && .venv/bin/python bench/bench_import.py --rows 2000000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness
sys.path.insert(0, str(REPO))  # localkube

from localkube.common import Context  # noqa: E402
from localkube.images.containerd import ensure_images  # noqa: E402

from harness.deployed_operator import install_operator  # noqa: E402
from harness.e2e_backup import superuser_sql  # noqa: E402
from harness.import_source import (  # noqa: E402
    BIN,
    READER,
    SOURCE,
    import_bootstrap,
    password_secret,
    source_sql,
    start_source,
)
from harness.local_cluster import Kube  # noqa: E402
from harness.objects import cluster  # noqa: E402
from harness.pgcluster import SMALL, status, wait_serving  # noqa: E402
from harness.waiting import wait_until  # noqa: E402
from pg_operator.images import default_image  # noqa: E402

NS = "bench-import"
PASSWORD = "bench-reader-0123456789"
SEED = """
CREATE TABLE items (id bigint PRIMARY KEY, sku text NOT NULL, price numeric(12,2), note text,
                    created timestamptz NOT NULL DEFAULT now());
INSERT INTO items SELECT g, 'sku-' || (g % 100000), g * 0.01, md5(g::text) || md5((g + 1)::text), now()
  FROM generate_series(1, {rows}) g;
CREATE INDEX items_by_sku ON items (sku);
CREATE TABLE events (id bigint PRIMARY KEY, item bigint, what text);
INSERT INTO events SELECT g, g, 'event ' || g FROM generate_series(1, {rows} / 2) g;
"""


def seconds(start: str, end: str) -> float:
    parse = dt.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def pod_span(pod: dict[str, Any], first: str, last: str) -> float | None:
    """Seconds from container `first`'s start to container `last`'s end (init or main)."""
    st = pod.get("status") or {}
    by_name = {
        c["name"]: c for c in [*(st.get("initContainerStatuses") or ()), *(st.get("containerStatuses") or ())]
    }
    begin = ((by_name.get(first) or {}).get("state") or {}).get("terminated") or {}
    end = ((by_name.get(last) or {}).get("state") or {}).get("terminated") or {}
    if not begin.get("startedAt") or not end.get("finishedAt") or end.get("exitCode") != 0:
        return None
    return seconds(begin["startedAt"], end["finishedAt"])


def pods(kube: Kube, selector: str) -> list[dict[str, Any]]:
    out = kube.kubectl("get", "pods", "-n", NS, "-l", selector, "-o", "json", check=False)
    return list(json.loads(out.stdout or "{}").get("items") or []) if out.returncode == 0 else []


def imported(kube: Kube, jobs: int) -> float:
    """A cluster importing the source with `jobs`; the import Job's pod's span."""
    name = f"imported-j{jobs}"
    kube.kubectl("apply", "-f", "-", input=json.dumps(password_secret(NS, f"{name}-reader", PASSWORD, name)))
    body = cluster(name, NS, replicas=1, version="17", storage="5Gi", resources=SMALL,
                   bootstrap=import_bootstrap(NS, f"{name}-reader", "bench", jobs))  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    # Watch the Job's pod: the operator deletes the Job (and its pod) once the status records success.
    span: float | None = None
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        for pod in pods(kube, f"batch.kubernetes.io/job-name={name}-import"):
            span = pod_span(pod, "dump", "restore") or span
        phase = (status(kube, NS, name).get("import") or {}).get("phase")
        if phase == "Failed":
            raise RuntimeError(f"{name}: the import failed: {status(kube, NS, name)['import']}")
        if phase == "Succeeded" and span is not None:
            return span
        time.sleep(0.5)
    raise RuntimeError(f"{name}: no import span within the hour")


PLAIN_PIPE = (
    f'{BIN}/pg_dump -Fc "$SRC" | {BIN}/pg_restore --no-owner --no-privileges --exit-on-error -d "$DST"'
)
PLAIN_DIR = (
    f'{BIN}/pg_dump -Fd -j "$J" -f /scratch/d "$SRC" && '
    f'{BIN}/pg_restore -j "$J" --no-owner --no-privileges --exit-on-error -d "$DST" /scratch/d'
)


def plain(kube: Kube, target: str, jobs: int) -> float:
    """pg_dump and pg_restore in a pod of the same image, into a new database of `target`."""
    db = f"plain_j{jobs}"
    primary = str(status(kube, NS, target)["currentPrimary"])
    superuser_sql(kube, NS, primary, f"CREATE DATABASE {db} OWNER app")
    name = f"plain-j{jobs}"
    src = f"host={SOURCE}.{NS}.svc user={READER} dbname=bench sslmode=disable"
    dst = f"host={target}-rw.{NS}.svc dbname={db} sslmode=require"
    env = [{"name": "SRC", "value": src}, {"name": "DST", "value": dst}, {"name": "J", "value": str(jobs)},
           {"name": "PGPASSWORD", "value": PASSWORD}]  # fmt: skip
    # Two passwords (the source's, the app role's): a pgpass file the script writes.
    script = ('printf "*:*:*:app:%s\\n*:*:*:reader:%s\\n" "$APPPASS" "$PGPASSWORD" > /tmp/pgpass; '
              "chmod 600 /tmp/pgpass; unset PGPASSWORD; export PGPASSFILE=/tmp/pgpass PGUSER=app; set -e; "
              + (PLAIN_PIPE if jobs == 1 else PLAIN_DIR))  # fmt: skip
    app_password = {"secretKeyRef": {"name": f"{target}-app", "key": "password"}}
    security = {"runAsNonRoot": True, "runAsUser": 999, "seccompProfile": {"type": "RuntimeDefault"}}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"bench": name}},
        "spec": {
            "restartPolicy": "Never", "securityContext": security,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [{
                "name": "plain", "image": default_image("17"), "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "env": [*env, {"name": "APPPASS", "valueFrom": app_password}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def done() -> float | None:
        (got,) = pods(kube, f"bench={name}") or [{}]
        terminated = (((got.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {}).get(
            "terminated"
        )
        if terminated and terminated.get("exitCode") != 0:
            raise RuntimeError(f"{name} failed: {terminated.get('message') or terminated.get('reason')}")
        return pod_span(got, "plain", "plain") if terminated else None

    span: float = wait_until(f"{name} to finish", done, 3600, 0.5)
    return span


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the large table")
    parser.add_argument("--installed", action="store_true", help="use the operator already installed")
    args = parser.parse_args()
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    if not args.installed:
        install_operator(kube)
    ensure_images(kube.ctx, [default_image("15"), default_image("17")])
    kube.kubectl("create", "namespace", NS, check=False)
    load_before = os.getloadavg()
    out: dict[str, Any] = {"bench": "import", "rows": args.rows}
    try:
        start_source(kube, NS, PASSWORD)
        source_sql(kube, NS, "CREATE DATABASE bench")
        source_sql(kube, NS, SEED.format(rows=args.rows), "bench", timeout=3600)
        out["source_bytes"] = int(source_sql(kube, NS, "SELECT pg_database_size('bench')"))
        for jobs in (1, 2):
            out[f"import_j{jobs}_s"] = imported(kube, jobs)
            wait_serving(kube, NS, f"imported-j{jobs}", 1, 600)
            out[f"plain_j{jobs}_s"] = plain(kube, f"imported-j{jobs}", jobs)
            out[f"ratio_j{jobs}"] = round(out[f"import_j{jobs}_s"] / max(out[f"plain_j{jobs}_s"], 1.0), 2)
            out[f"import_j{jobs}_mb_s"] = round(
                out["source_bytes"] / 1e6 / max(out[f"import_j{jobs}_s"], 1.0), 2
            )
    finally:
        subprocess.run([str(ctx.bin / "kubectl"), "--kubeconfig", str(ctx.admin_kubeconfig), "delete",
                        "namespace", NS, "--wait=false"], check=False, capture_output=True)  # fmt: skip
    out["load_avg_1m_before"] = round(load_before[0], 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
