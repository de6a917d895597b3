"""Storage growth: the StatefulSet's volumeClaimTemplates are immutable, so a larger spec.storage is
applied by patching each data PVC (the StorageClass must allow volume expansion). Never shrinks."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import DATA_VOLUME
from pg_operator.api.quantity import parse_quantity
from pg_operator.specs import names


def _is_data_pvc(cluster: PostgresCluster, pvc: Mapping[str, Any]) -> bool:
    meta = objects.meta(pvc)
    if meta.get("namespace", cluster.namespace) != cluster.namespace or objects.deleting(pvc):
        return False
    pattern = rf"{re.escape(DATA_VOLUME)}-{re.escape(names.statefulset(cluster))}-[0-9]+"
    return re.fullmatch(pattern, str(meta.get("name", ""))) is not None


def pvc_resizes(
    cluster: PostgresCluster, pvcs: Sequence[Mapping[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """(PVC name, merge patch) for each of the cluster's data PVCs that requests less than spec.storage."""
    wanted = parse_quantity(cluster.spec.storage)
    patches: list[tuple[str, dict[str, Any]]] = []
    for pvc in pvcs:
        if not _is_data_pvc(cluster, pvc):
            continue
        requested = (objects.spec(pvc).get("resources") or {}).get("requests", {}).get("storage")
        if requested is not None and parse_quantity(requested) >= wanted:
            continue
        patch = {"spec": {"resources": {"requests": {"storage": cluster.spec.storage}}}}
        patches.append((str(pvc["metadata"]["name"]), patch))
    return sorted(patches, key=lambda p: p[0])
