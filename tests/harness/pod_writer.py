"""A writer of many short transactions that runs in a pod of the cluster (the PostgreSQL image: Python and
psycopg), for the multi-node sub-tier: there the host is outside every node, as a laptop is outside a
production cluster, and reaches no Service address (docs/local-cluster.md), so pooler_load's host-side
TxWriter cannot reach `-pooler-rw`.

Same counting as pooler_load.TxWriter: each transaction one INSERT on a new connection (an application
without a pool) to a Service by its DNS name, TLS verified against the app Secret's CA (verify-full),
generous client timeouts (a pooler that holds a transaction while it switches over may hold it); every
failed transaction counted, the longest stall between two acknowledged commits measured. The pod prints a
progress line every second and, once told to stop, one JSON summary line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.local_cluster import Kube
from harness.waiting import wait_until
from pg_operator.images import default_image

STOP_FILE = "/tmp/stop"
SUMMARY_PREFIX = "SUMMARY "
PROGRESS_PREFIX = "PROGRESS "

SCRIPT = """
import json, os, time
import psycopg
from psycopg import sql
dsn = dict(host=os.environ["PGHOST"], port=5432, user=os.environ["PGUSER"], password=os.environ["PGPASSWORD"],
           dbname=os.environ["PGDATABASE"], sslmode="verify-full", sslrootcert="/ca/ca.crt")
table = sql.Identifier(os.environ["TABLE"])
while True:
    try:
        with psycopg.connect(**dsn, autocommit=True, connect_timeout=10) as c:
            c.execute(sql.SQL("create table if not exists {} (id bigserial primary key, "
                              "at timestamptz default now())").format(table))
        break
    except psycopg.Error as exc:
        print("WAITING", str(exc).strip()[:200], flush=True)
        time.sleep(1)
insert = sql.SQL("insert into {} default values").format(table)
acked = failed = 0
errors = []
stall = 0.0
last = None
told = time.monotonic()
while not os.path.exists(os.environ["STOP_FILE"]):
    try:
        with psycopg.connect(**dsn, autocommit=True, connect_timeout=60, prepare_threshold=None,
                             tcp_user_timeout=60000) as c:
            c.execute(insert)
        now = time.monotonic()
        acked += 1
        if last is not None:
            stall = max(stall, now - last)
        last = now
    except psycopg.Error as exc:
        failed += 1
        if len(errors) < 10:
            errors.append(str(exc).strip()[:300])
        time.sleep(0.05)
    if time.monotonic() - told >= 1:
        print("PROGRESS", acked, failed, flush=True)
        told = time.monotonic()
    time.sleep(0.02)
print("SUMMARY", json.dumps({"acked": acked, "failed": failed, "stall": round(stall, 3), "errors": errors}),
      flush=True)
time.sleep(86400)
"""


@dataclass
class Summary:
    acked: int
    failed: int
    stall: float  # seconds, the longest time between two acknowledged commits
    errors: list[str]


def writer_pod(
    name: str, namespace: str, cluster: str, service: str, node: str, table: str
) -> dict[str, Any]:
    """The writer's pod, pinned to `node` (a test keeps it off the node it drains or cuts off)."""
    secret = f"{cluster}-app"

    def from_secret(var: str, key: str) -> dict[str, Any]:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "tx-writer"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 999,
                "runAsGroup": 999,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "writer",
                    "image": default_image("16"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/opt/pg-operator/bin/python", "-c", SCRIPT],
                    "env": [
                        {"name": "PGHOST", "value": f"{service}.{namespace}.svc"},
                        from_secret("PGUSER", "username"),
                        from_secret("PGPASSWORD", "password"),
                        from_secret("PGDATABASE", "dbname"),
                        {"name": "TABLE", "value": table},
                        {"name": "STOP_FILE", "value": STOP_FILE},
                    ],
                    "volumeMounts": [{"name": "ca", "mountPath": "/ca", "readOnly": True}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
                }
            ],
            "volumes": [
                {
                    "name": "ca",
                    "secret": {"secretName": secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]},
                }
            ],
        },
    }


class PodWriter:
    """A writer pod as the test drives it: start, wait for commits, stop and read the summary."""

    def __init__(self, kube: Kube, pod: dict[str, Any]) -> None:
        self.kube, self.pod = kube, pod
        self.name, self.namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]

    def start(self) -> PodWriter:
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(self.pod))
        self.kube.kubectl("-n", self.namespace, "wait", "--for=condition=Ready", f"pod/{self.name}",
                          "--timeout=180s", timeout=190)  # fmt: skip
        return self

    def progress(self) -> tuple[int, int]:
        """(acknowledged, failed) so far, from the pod's last progress line."""
        out = self.kube.kubectl("-n", self.namespace, "logs", self.name, "--tail=20", check=False).stdout
        lines = [line.split() for line in out.splitlines() if line.startswith(PROGRESS_PREFIX)]
        return (int(lines[-1][1]), int(lines[-1][2])) if lines else (0, 0)

    def wait_for(self, commits: int, timeout: float) -> int:
        """Until `commits` more transactions than now are acknowledged; the count reached."""
        start = self.progress()[0]

        def reached() -> int:
            acked = self.progress()[0]
            return acked if acked >= start + commits else 0

        return int(wait_until(f"{commits} commits by {self.name}", reached, timeout, 1))

    def stop(self, timeout: float = 120) -> Summary:
        self.kube.kubectl("-n", self.namespace, "exec", self.name, "--", "touch", STOP_FILE)

        def summary() -> Summary | None:
            out = self.kube.kubectl("-n", self.namespace, "logs", self.name, "--tail=5", check=False).stdout
            for line in out.splitlines():
                if line.startswith(SUMMARY_PREFIX):
                    return Summary(**json.loads(line[len(SUMMARY_PREFIX) :]))
            return None

        found: Summary = wait_until(f"the summary of {self.name}", summary, timeout, 1)
        self.kube.kubectl("-n", self.namespace, "delete", "pod", self.name, "--wait=false", check=False)
        return found
