"""A tenant's labelled junk and the operator's memory (kwok profile): 200 Secrets of 256-512 KiB of random
data, each carrying the cluster's label, created in the cluster's namespace while the operator watches
it. The operator's watch cache keeps only what a reconcile reads (controller/cache_admission.py), so its
resident memory grows by no more than a bound far below the junk's size, and the cluster still
reconciles. Held as they came, the Secrets would stay in its memory for as long as they exist."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.kube import apply, get_or_none, make_namespace
from harness.kwok_status import wait_ready
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import OperatorEnv, start_operator
from harness.waiting import wait_until

JUNK_SECRETS = 200
# A correctness bound, not a timing one: the junk is about 75 MiB of base64 (random data does not
# compress), held it would add at least that much.
MAX_GROWTH_MIB = 20.0


def rss_mib(pid: int) -> float:
    """The process's resident set (VmRSS) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def junk_secret(namespace: str, cluster_name: str, index: int) -> dict[str, Any]:
    size = 256 * 1024 + (index * 1297) % (256 * 1024)  # 256-512 KiB, spread
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"junk-{index:03d}",
            "namespace": namespace,
            "labels": {CLUSTER_LABEL: cluster_name},
        },
        "type": "Opaque",
        "data": {"blob": base64.b64encode(os.urandom(size)).decode()},
    }


def create_junk(kube: Any, namespace: str, cluster_name: str) -> int:
    """Create the junk Secrets with one kubectl (a request each); their total size in bytes of data."""
    items = [junk_secret(namespace, cluster_name, i) for i in range(JUNK_SECRETS)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
        path = f.name
    try:
        kube.kubectl("create", "-f", path)
    finally:
        os.unlink(path)
    return sum(len(i["data"]["blob"]) for i in items)


def test_labelled_junk_secrets_do_not_grow_the_operators_memory(operator_env: OperatorEnv) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "junk")
    op = start_operator(operator_env, "cache-bounds", "--namespace", ns, "--resync-seconds", "30")
    try:
        op.wait_leader()
        name = "junk-db"
        # Scaled to two below, on the kwok profile's one node: the instances may share it (`auto` would
        # have chosen `required` for one instance on one node, and the second would be TooFewNodes).
        apply(kube, cluster(name, ns, replicas=1, affinity={"podAntiAffinity": "preferred"}))
        wait_ready(kube, ns, name, 1)
        app = wait_until("the app Secret", lambda: get_or_none(kube, "secret", f"{name}-app", "-n", ns))
        before = rss_mib(op.pid)

        junk_bytes = create_junk(kube, ns, name)
        # The Secrets' watch delivers in order: once the operator has recreated the app Secret deleted
        # after the junk, it has taken every junk event before it.
        kube.kubectl("delete", "secret", f"{name}-app", "-n", ns)

        def recreated() -> Any:
            found = get_or_none(kube, "secret", f"{name}-app", "-n", ns)
            return found if found and found["metadata"]["uid"] != app["metadata"]["uid"] else None

        wait_until("the operator to recreate the app Secret after the junk", recreated, timeout=120)
        assert op.alive(), op.log_text()[-3000:]
        # Freed memory goes back to the system at the operator's next heap trim (every 10 s).
        samples: list[float] = []

        def bounded() -> bool:
            samples.append(rss_mib(op.pid))
            return samples[-1] - before < MAX_GROWTH_MIB

        try:
            wait_until("the operator's RSS back within the bound", bounded, timeout=60, interval=2)
        except Exception as exc:
            raise AssertionError(
                f"RSS {before:.1f} MiB before {JUNK_SECRETS} junk Secrets ({junk_bytes / 2**20:.1f} MiB), "
                f"after: {', '.join(f'{s:.1f}' for s in samples[-5:])} MiB"
            ) from exc
        print(f"RSS {before:.1f} MiB before, {samples[-1]:.1f} MiB after {JUNK_SECRETS} junk Secrets "
              f"({junk_bytes / 2**20:.1f} MiB)")  # fmt: skip

        # Still reconciling: a scale-up is carried out.
        kube.kubectl("patch", "postgresclusters.db.example.com", name, "-n", ns, "--type=merge",
                     "-p", '{"spec": {"replicas": 2}}')  # fmt: skip
        wait_ready(kube, ns, name, 2)
        assert rss_mib(op.pid) - before < MAX_GROWTH_MIB + 10  # the junk is still there, still not held
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        op.stop()
