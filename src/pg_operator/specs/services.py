"""Services: headless `<name>` (pod DNS), `-rw` (primary), `-ro` (replicas), `-r` (any instance)."""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import (
    PATRONI_PORT,
    PATRONI_PORT_NAME,
    PG_PORT,
    PG_PORT_NAME,
    ROLE_LABEL,
    ROLE_PRIMARY,
    ROLE_REPLICA,
)
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_SERVICE, child_metadata, selector_labels


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def _service(
    cluster: PostgresCluster, name: str, selector: dict[str, str], *, headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [_port(PG_PORT_NAME, PG_PORT)],
        "publishNotReadyAddresses": False,
    }
    if headless:
        # Pod DNS names must resolve while an instance bootstraps or catches up (not yet ready), and
        # Patroni's REST API is reachable for switchovers and scraping.
        spec.update(
            clusterIP="None",
            publishNotReadyAddresses=True,
            ports=[_port(PG_PORT_NAME, PG_PORT), _port(PATRONI_PORT_NAME, PATRONI_PORT)],
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(cluster, name, COMPONENT_SERVICE),
        "spec": spec,
    }


def services(cluster: PostgresCluster) -> list[dict[str, Any]]:
    pods = selector_labels(cluster)
    return [
        _service(cluster, names.headless_service(cluster), pods, headless=True),
        _service(cluster, names.rw_service(cluster), {**pods, ROLE_LABEL: ROLE_PRIMARY}),
        _service(cluster, names.ro_service(cluster), {**pods, ROLE_LABEL: ROLE_REPLICA}),
        _service(cluster, names.r_service(cluster), pods),
    ]
