"""Volumes for the scale bench, the same for both halves and out of the timed phase.

Binding is not what is measured, and kube-controller-manager's PV controller binds one claim at a time
(~55 a minute on the loaded 2-core machine: ~1 h for 3000 claims, in each half), so before the clock
starts the bench creates, for every claim the StatefulSets will use (`data-<cluster>-<ordinal>`, the claim
template's exact labels and spec), the claim and its PersistentVolume already bound to each other
(volumeName, claimRef with the claim's uid, bind-completed, both statuses Bound; a StorageClass of the
bench's own, no provisioner). The StatefulSet controller finds the claims and creates none; the PV
controller finds nothing to do."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from lightkube import AsyncClient, Client, KubeConfig, codecs
from lightkube.core.exceptions import ApiError
from lightkube.types import PatchType

from harness.objects import cluster
from harness.objects import storage_class as storage_class_body
from harness.waiting import wait_until
from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs import desired_children
from scale.clusters import STORAGE_CLASS
from scale.measure import progress

VOLUME_NS_LABEL = "bench.pg-operator/claim-namespace"
CLAIM_TEMPLATE = "data"  # the StatefulSet's volumeClaimTemplate (docs/architecture.md: the volume `data`)
TEMPLATE_CLUSTER = "c0000"


def ensure_storage_class(client: Client) -> None:
    """No provisioner, Immediate: a claim binds to its pre-created volume as soon as it exists."""
    try:
        client.create(codecs.from_dict(storage_class_body(STORAGE_CLASS, reclaim="Retain")))
    except ApiError as exc:
        if exc.status.code != 409:
            raise


def claims_of(clusters: list[str], replicas: int) -> list[tuple[str, int]]:
    return [(c, i) for c in clusters for i in range(replicas)]


def claim_template(ns: str, replicas: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The StatefulSet's claim template and selector labels, from the same builders the operator uses."""
    body = cluster(TEMPLATE_CLUSTER, ns, replicas=replicas, storageClassName=STORAGE_CLASS)
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    sts = next(c for c in desired_children(PostgresCluster.from_obj(body)) if c["kind"] == "StatefulSet")
    return sts["spec"]["volumeClaimTemplates"][0], dict(sts["spec"]["selector"]["matchLabels"])


def volume_name(ns: str, claim: str) -> str:
    return f"bench-{ns}-{claim}"


def claim_body(
    ns: str, cluster: str, ordinal: int, template: dict[str, Any], selector: dict[str, str]
) -> dict[str, Any]:
    """The claim as the StatefulSet controller would create it (template labels + selector labels), but
    already bound to its volume."""
    labels = {**(template["metadata"].get("labels") or {}), **selector}
    labels = {k: cluster if v == TEMPLATE_CLUSTER else v for k, v in labels.items()}
    name = f"{CLAIM_TEMPLATE}-{cluster}-{ordinal}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {**template["spec"], "volumeName": volume_name(ns, name)},
    }


def volume_body(ns: str, claim: str, claim_uid: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(ns, claim), "labels": {VOLUME_NS_LABEL: ns}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/tmp/kwok-pv/{ns}/{claim}"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": ns,
                "name": claim,
                "uid": claim_uid,
            },
        },
    }


async def bind_volumes_async(
    config: KubeConfig, ns: str, claims: list[tuple[str, int]], replicas: int, workers: int
) -> None:
    from lightkube.resources.core_v1 import PersistentVolumeClaimStatus, PersistentVolumeStatus

    template, selector = claim_template(ns, replicas)
    size = template["spec"]["resources"]["requests"]["storage"]
    client = AsyncClient(config, field_manager="bench-volumes")
    sem = asyncio.Semaphore(workers)
    claim_status = {
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}
    }

    async def one(cluster: str, ordinal: int) -> None:
        body = claim_body(ns, cluster, ordinal, template, selector)
        name = body["metadata"]["name"]
        async with sem:
            pvc = await client.create(codecs.from_dict(body))
            assert pvc.metadata is not None and pvc.metadata.uid
            await client.create(codecs.from_dict(volume_body(ns, name, pvc.metadata.uid, size)))
            await client.patch(
                PersistentVolumeClaimStatus, name, claim_status, namespace=ns, patch_type=PatchType.MERGE
            )
            await client.patch(
                PersistentVolumeStatus,
                volume_name(ns, name),
                {"status": {"phase": "Bound"}},
                patch_type=PatchType.MERGE,
            )

    try:
        await asyncio.gather(*(one(c, i) for c, i in claims))
    finally:
        await client.close()


def bound_claims(client: Client, ns: str) -> int:
    from lightkube.resources.core_v1 import PersistentVolumeClaim

    return sum(
        1
        for pvc in client.list(PersistentVolumeClaim, namespace=ns)
        if pvc.status is not None
        and pvc.status.phase == "Bound"
        and pvc.spec is not None
        and pvc.spec.volumeName
    )


def prepare_volumes(
    client: Client, config: KubeConfig, ns: str, claims: list[tuple[str, int]], replicas: int, timeout: float
) -> float:
    """Create the half's bound claim/volume pairs; returns the seconds it took (not timed)."""
    started = time.monotonic()
    progress(f"creating {len(claims)} bound claims and volumes in {ns}")
    asyncio.run(bind_volumes_async(config, ns, claims, replicas, workers=16))
    wait_until(
        f"{len(claims)} claims Bound", lambda: bound_claims(client, ns) >= len(claims), timeout=timeout
    )
    return time.monotonic() - started


async def delete_volumes_async(config: KubeConfig, ns: str, workers: int = 16) -> None:
    from lightkube.resources.core_v1 import PersistentVolume

    client = AsyncClient(config, field_manager="bench-volumes")
    sem = asyncio.Semaphore(workers)
    names = [
        pv.metadata.name
        async for pv in client.list(PersistentVolume, labels={VOLUME_NS_LABEL: ns})
        if pv.metadata is not None and pv.metadata.name
    ]

    async def one(name: str) -> None:
        async with sem:
            with contextlib.suppress(ApiError):
                await client.delete(PersistentVolume, name)

    try:
        await asyncio.gather(*(one(n) for n in names))
    finally:
        await client.close()


def delete_volumes(config: KubeConfig, ns: str) -> None:
    asyncio.run(delete_volumes_async(config, ns))
