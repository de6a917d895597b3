"""Where the operator's memory goes, at growing numbers of clusters (kwok profile). Prints one JSON line.

The operator runs in this process (the same `operator.run` as `pg-operator run`, with the admin
kubeconfig), so its state can be inspected between stages: RSS, the deep size of the read cache by
kind (observe.Cache), our wake-up fingerprints, live objects
by type, and (with --tracemalloc) the allocations by source file. Stages are cumulative:

    .venv/bin/python bench/profile_operator_memory.py --stages 0,100,300
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import gc
import itertools
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness (it puts the repo root on sys.path for localkube)

from lightkube import Client, KubeConfig  # noqa: E402
from lightkube.resources.core_v1 import Namespace  # noqa: E402
from scale.clusters import (  # noqa: E402
    RoleLabeller,
    cluster_names,
    create_clusters,
    ensure_namespace,
    ready_clusters,
)
from scale.measure import progress  # noqa: E402
from scale.volumes import claims_of, delete_volumes, ensure_storage_class, prepare_volumes  # noqa: E402

from harness.kube import ExternalKube  # noqa: E402
from harness.net import free_port  # noqa: E402
from harness.operator_process import OPERATOR_NS, install_operator_identity  # noqa: E402
from harness.waiting import wait_until  # noqa: E402
from pg_operator.controller import cache as observe  # noqa: E402
from pg_operator.controller.operator import Options, run  # noqa: E402
from pg_operator.controller.wakeups import Wakeups  # noqa: E402


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by a tree of dicts/lists/tuples/strings/bytes (each object counted once)."""
    seen = set() if seen is None else seen
    stack = [obj]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
    return total


def rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def of_type(name: str) -> list[Any]:
    return [o for o in gc.get_objects() if type(o).__name__ == name]


def index_sizes(cache: observe.Cache) -> dict[str, dict[str, float]]:
    """Per cached kind: objects held, their deep size, and the size of the same values as compact JSON."""
    out: dict[str, dict[str, float]] = {}
    for (_, kind), store in cache._stores.items():
        values = [v for objects in store.by_key.values() for v in objects.values()]
        seen: set[int] = set()
        size = sum(deep_size(v, seen) for v in values)
        as_json = sum(
            len(v) if isinstance(v, bytes) else len(json.dumps(v, separators=(",", ":")).encode())
            for v in values
        )
        out[kind] = {
            "objects": len(values),
            "kib": round(size / 1024, 1),
            "bytes_per_object": round(size / len(values)) if values else 0,
            "json_bytes_per_object": round(as_json / len(values)) if values else 0,
        }
    return out


def measure(label: str, with_trace: bool) -> dict[str, Any]:
    gc.collect()
    caches = of_type("Cache")
    wakeups = [o for o in gc.get_objects() if isinstance(o, Wakeups)]
    tasks = collections.Counter(
        (t.get_coro().__qualname__ if hasattr(t.get_coro(), "__qualname__") else "?")  # type: ignore[union-attr]
        for t in asyncio.all_tasks()
    )
    objects = gc.get_objects()
    by_type = collections.Counter(type(o).__name__ for o in objects)
    row: dict[str, Any] = {
        "stage": label,
        "rss_mib": round(rss_mib(), 1),
        "hwm_mib": round(rss_mib("VmHWM"), 1),
        "gc_objects": len(objects),
        "top_types": dict(by_type.most_common(10)),
        "asyncio_tasks": dict(tasks.most_common(6)),
    }
    del objects
    if caches:
        indexes = index_sizes(caches[0])
        row["indexes"] = indexes
        row["indexes_total_mib"] = round(sum(v["kib"] for v in indexes.values()) / 1024, 1)
    if wakeups:
        seen = wakeups[0]._seen
        row["wakeups_seen"] = {"entries": len(seen), "kib": round(deep_size(seen) / 1024)}
    if with_trace:
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("filename")
        row["traced_mib"] = round(sum(s.size for s in stats) / 2**20, 1)
        row["tracemalloc_overhead_mib"] = round(tracemalloc.get_tracemalloc_memory() / 2**20, 1)
        row["traced_by_file_mib"] = {
            "/".join(Path(str(s.traceback[0].filename)).parts[-2:]): round(s.size / 2**20, 1)
            for s in stats[:14]
        }
    # What glibc holds freed but not returned (fragmented heap): RSS once malloc_trim has given it back.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        row["rss_after_malloc_trim_mib"] = round(rss_mib(), 1)
    return row


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    kubeconfig = os.environ.get("PGOP_TEST_KUBECONFIG") or str(
        Path(os.environ.get("PGOP_STATE", "/var/lib/pg-operator-localkube")) / "admin.kubeconfig"
    )
    os.environ["KUBECONFIG"] = kubeconfig
    kube = ExternalKube(kubeconfig)
    admin = KubeConfig.from_file(kubeconfig)
    client = Client(admin, field_manager="bench")
    install_operator_identity(kube)
    ns = f"memprof-{time.strftime('%H%M%S')}"
    ensure_namespace(client, ns)
    ensure_storage_class(client)  # the scale bench's class: claims and volumes made bound (scale/volumes.py)
    opts = Options(
        namespaces=[ns],
        lease_namespace=OPERATOR_NS,
        lease_name=f"memprof-{os.getpid()}",
        identity=f"memprof-{os.getpid()}",
        health_port=free_port(),
        metrics_port=free_port(),
        workers=args.workers,
        resync_seconds=args.resync_seconds,
    )
    operator = asyncio.create_task(run(opts))
    rows = []
    created = 0
    started = time.monotonic()

    def cache_ready() -> bool:
        # The operator's cache, once its sync gate has opened (leading, every listed object seen).
        return any(isinstance(c, observe.Cache) and c.gate is not None and c.synced for c in of_type("Cache"))

    await asyncio.to_thread(wait_until, "operator cache bound", cache_ready, 120, 0.5)
    for stage in args.stages:
        more = stage - created
        if more > 0:
            claims = claims_of(cluster_names(more, created), args.replicas)
            await asyncio.to_thread(prepare_volumes, client, admin, ns, claims, args.replicas, args.timeout)
            progress(f"creating clusters {created}..{stage - 1}")

            def make(first: int = created, count: int = more) -> None:
                create_clusters(client, ns, count, args.replicas, first=first)

            await asyncio.to_thread(make)
            created = stage
            await asyncio.to_thread(
                wait_until,
                f"{stage} clusters Ready",
                lambda n=stage: ready_clusters(client, ns) == n,
                args.timeout,
                2,
            )
        await asyncio.sleep(args.settle)
        row = measure(str(stage), args.tracemalloc)
        row["elapsed_s"] = round(time.monotonic() - started, 1)
        rows.append(row)
        progress(json.dumps(row))
    os.kill(os.getpid(), 15)  # the operator's own signal handler: a clean stop
    await operator
    client.delete(Namespace, ns)
    await asyncio.to_thread(delete_volumes, admin, ns)
    per = []
    for a, b in itertools.pairwise(rows):
        clusters = int(b["stage"]) - int(a["stage"])
        if clusters > 0:
            per.append(round((b["rss_mib"] - a["rss_mib"]) * 1024 / clusters, 1))
    return {
        "bench": "operator_memory_profile",
        "replicas": args.replicas,
        "rss_kib_per_cluster_between_stages": per,
        "load_average": os.getloadavg(),
        "stages": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")], default=[0, 100, 300])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--resync-seconds", type=float, default=300.0)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait before each measurement")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--tracemalloc", action="store_true", help="also attribute allocations by file")
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start(1)
    kubeconfig = os.environ.get("PGOP_TEST_KUBECONFIG") or str(
        Path(os.environ.get("PGOP_STATE", "/var/lib/pg-operator-localkube")) / "admin.kubeconfig"
    )
    with RoleLabeller(KubeConfig.from_file(kubeconfig)):
        result = asyncio.run(main_async(args))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
