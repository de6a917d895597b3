"""The floor of the scale bench: a plain script creating the same children directly (same builders, same
concurrency: `workers` clusters at a time, a cluster's children in the same two waves of concurrent
writes as the operator's workers send them), and waiting for the same readiness as the operator's Ready
condition (every instance ready, and a ready primary: pods labelled with their role by the same
stand-in as in the operator half)."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import httpx2  # lightkube's HTTP client: its timeouts
from lightkube import AsyncClient, Client, KubeConfig, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from harness.objects import CLUSTER_LABEL
from pg_operator.api.cluster import PostgresCluster
from pg_operator.controller.kube_api import MAX_IN_FLIGHT, resource_for
from pg_operator.controller.reconcile import SECOND_WAVE
from pg_operator.specs import ClusterPasswords, build_secrets, desired_children
from scale.clusters import cluster_names, create_clusters, ensure_namespace, wait_all
from scale.measure import progress
from scale.volumes import claims_of, prepare_volumes


def ready_floor_clusters(client: Client, ns: str, replicas: int) -> int:
    """The operator's Ready, without the operator: every instance ready and a ready primary (pod
    `<cluster>-0` labelled role=primary by the stand-in)."""
    from lightkube.resources.apps_v1 import StatefulSet

    primaries = set()
    for pod in client.list(Pod, namespace=ns, labels={"role": "primary"}):
        conditions = (pod.status.conditions if pod.status else None) or []
        if pod.metadata and any(c.type == "Ready" and c.status == "True" for c in conditions):
            primaries.add((pod.metadata.labels or {}).get(CLUSTER_LABEL))
    return sum(
        1
        for s in client.list(StatefulSet, namespace=ns)
        if s.status
        and (s.status.readyReplicas or 0) == replicas
        and s.metadata is not None
        and s.metadata.name in primaries
    )


FLOOR_ATTEMPTS = 5


async def floor_create(config: KubeConfig, clusters: list[Any], workers: int) -> int:
    """What the operator does for a new cluster, done directly and the same way: `workers` clusters at
    a time; each cluster's children in the operator's two waves (the RoleBinding and the StatefulSet
    after the rest and the Secrets); at most as many requests in flight as the operator's client."""
    client = AsyncClient(config, field_manager="bench-floor")
    sem = asyncio.Semaphore(workers)
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    requests = 0

    async def send(call: Any) -> None:
        # The operator retries a request the loaded API server did not answer in time; so does the
        # floor (a create whose first try went through then finds its object: that is success too).
        nonlocal requests
        for attempt in range(1, FLOOR_ATTEMPTS + 1):
            requests += 1
            try:
                async with slots:
                    await call()
                return
            except httpx2.TimeoutException:
                if attempt == FLOOR_ATTEMPTS:
                    raise
                progress(f"floor: a request timed out (try {attempt}); retrying")
            except ApiError as exc:
                if exc.status.code == 409 and attempt > 1:
                    return
                raise

    def apply(child: dict[str, Any], namespace: str) -> Any:
        res = resource_for(child["apiVersion"], child["kind"])
        name = child["metadata"]["name"]
        return lambda: client.patch(
            res, name, child, namespace=namespace, patch_type=PatchType.APPLY, force=True
        )

    async def one(obj: Any) -> None:
        cluster = PostgresCluster.from_obj(obj.to_dict() if hasattr(obj, "to_dict") else obj)
        children = desired_children(cluster)
        first = [c for c in children if c["kind"] not in SECOND_WAVE]
        second = [c for c in children if c["kind"] in SECOND_WAVE]
        secrets = build_secrets(cluster, ClusterPasswords.generate())
        async with sem:
            await asyncio.gather(
                *(send(apply(c, cluster.namespace)) for c in first),
                *(send(lambda s=s: client.create(codecs.from_dict(s))) for s in secrets),
            )
            await asyncio.gather(*(send(apply(c, cluster.namespace)) for c in second))

    await asyncio.gather(*(one(o) for o in clusters))
    await client.close()
    return requests


def run_floor_half(
    args: argparse.Namespace, client: Client, admin: KubeConfig, floor_ns: str, result: dict[str, Any]
) -> None:
    n, r = args.clusters, args.replicas
    if True:
        # --- the floor: the same children, created directly ---------------------------------------
        ensure_namespace(client, floor_ns)
        result["volumes_seconds_floor"] = round(
            prepare_volumes(client, admin, floor_ns, claims_of(cluster_names(n), r), r, args.timeout), 1
        )
        progress(f"floor: creating {n} clusters' children directly")
        started = time.monotonic()
        clusters = create_clusters(client, floor_ns, n, r)
        floor_requests = n + asyncio.run(floor_create(admin, clusters, args.workers))
        wait_all("floor clusters ready", lambda: ready_floor_clusters(client, floor_ns, r), n, args.timeout)
        result["floor"] = {
            "seconds_to_all_ready": round(time.monotonic() - started, 1),
            "requests_per_cluster": round(floor_requests / n, 2),
        }
        if "operator" in result:
            result["ratio_to_floor"] = round(
                result["operator"]["seconds_to_all_ready"] / result["floor"]["seconds_to_all_ready"], 2
            )
        result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
