"""The floor of the scale bench: the fastest plain script that creates the same objects as the operator
and waits for the same readiness as its Ready condition (every instance ready, and a ready primary: pods
labelled with their role by the same stand-in as in the operator half).

Every object is sent as soon as it can be: a cluster's children (with its TLS Secrets and an app Secret
that already holds `ca.crt`) the moment its PostgresCluster exists, every cluster at once, with as many
requests in flight as `--floor-in-flight` allows (the API server's own limit is the real cap). Nothing
copies the operator's design (its worker count, its in-flight cap, its two waves of writes)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
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
from pg_operator.api.constants import REPLICATION_USER
from pg_operator.controller.kube_api import resource_for
from pg_operator.specs import ClusterPasswords, build_secrets, desired_children, names
from pg_operator.specs.secrets import APP_CA_KEY
from pg_operator.specs.tls import b64, ca_secret, issue_client, issue_server, new_ca, server_secret
from scale.clusters import PGC, cluster_bodies, cluster_names, ensure_namespace, wait_all
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


# A loaded API server times requests out by the thousand at 128 in flight (section 14 of
# results-reconcile-scale.md); the floor must outlast that, as the operator's retries do.
FLOOR_ATTEMPTS = 20


def tls_secrets(cluster: PostgresCluster, app: dict[str, Any]) -> list[dict[str, Any]]:
    """The TLS sub-reconciler's Secrets (the cluster's CA; the server and replication certificates it signed),
    and `ca.crt` put straight into the app Secret instead of patched in afterwards."""
    now = dt.datetime.now(dt.UTC)
    ca = new_ca(cluster, now)
    server = issue_server(cluster, ca, now)
    replication = issue_client(ca, REPLICATION_USER, now)
    app["data"][APP_CA_KEY] = b64(ca.cert_pem)
    return [ca_secret(cluster, ca), server_secret(cluster, ca, server, replication)]


async def floor_create(config: KubeConfig, bodies: list[dict[str, Any]], in_flight: int) -> int:
    """Create every cluster and, the moment each exists (its children's owner references need its uid),
    all of its children: no waves, no per-cluster limit, `in_flight` requests at a time overall."""
    client = AsyncClient(config, field_manager="bench-floor")
    slots = asyncio.Semaphore(in_flight)
    requests = 0

    async def send(call: Any) -> Any:
        # A request the loaded API server did not answer in time is sent again (a create whose first
        # try went through then finds its object: that is success too).
        nonlocal requests
        for attempt in range(1, FLOOR_ATTEMPTS + 1):
            requests += 1
            try:
                async with slots:
                    return await call()
            except httpx2.TimeoutException:
                if attempt == FLOOR_ATTEMPTS:
                    raise
                progress(f"floor: a request timed out (try {attempt}); retrying")
            except ApiError as exc:
                if exc.status.code == 409 and attempt > 1:
                    return None
                raise
        return None

    def apply(child: dict[str, Any], namespace: str) -> Any:
        res = resource_for(child["apiVersion"], child["kind"])
        name = child["metadata"]["name"]
        return lambda: client.patch(
            res, name, child, namespace=namespace, patch_type=PatchType.APPLY, force=True
        )

    async def one(body: dict[str, Any]) -> None:
        created = await send(lambda: client.create(codecs.from_dict(body)))
        if created is None:  # the retried create found it: read its uid
            created = await send(lambda: client.get(PGC, body["metadata"]["name"],
                                                    namespace=body["metadata"]["namespace"]))  # fmt: skip
        cluster = PostgresCluster.from_obj(created.to_dict() if hasattr(created, "to_dict") else created)
        secrets = build_secrets(cluster, ClusterPasswords.generate())
        app = next(s for s in secrets if s["metadata"]["name"] == names.app_secret(cluster))
        secrets += tls_secrets(cluster, app)
        await asyncio.gather(
            *(send(apply(c, cluster.namespace)) for c in desired_children(cluster)),
            *(send(lambda s=s: client.create(codecs.from_dict(s))) for s in secrets),
        )

    await asyncio.gather(*(one(b) for b in bodies))
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
        bodies = cluster_bodies(floor_ns, n, r)
        floor_requests = asyncio.run(floor_create(admin, bodies, args.floor_in_flight))
        wait_all("floor clusters ready", lambda: ready_floor_clusters(client, floor_ns, r), n, args.timeout)
        result["floor"] = {
            "seconds_to_all_ready": round(time.monotonic() - started, 1),
            "requests_per_cluster": round(floor_requests / n, 2),
            "in_flight": args.floor_in_flight,
        }
        result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
