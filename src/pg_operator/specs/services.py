"""Services: headless `<name>` (pod DNS), `-rw` (primary), `-ro` (replicas), `-r` (any instance), and the
additional NodePort or LoadBalancer Services `spec.services.additional` declares (docs/exposure.md).

The tenant's annotations and labels (`spec.services`) go on the client Services, never the headless one;
they are laid under the operator's own, which always win (api/services.py refuses the keys it sets).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
from pg_operator.api.pooler import pooler_pod_labels
from pg_operator.api.services import MAX_HOSTS, AdditionalService, host_problem
from pg_operator.pooler_contract import POOLER_PORT
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_SERVICE, child_metadata, selector_labels

COMPONENT_EXPOSURE = "exposure"  # app.kubernetes.io/component of the additional Services
POOLER_PORT_NAME = "pgbouncer"


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def with_tenant_metadata(
    metadata: dict[str, Any], labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    """`metadata` with the tenant's labels and annotations laid under the operator's own."""
    return {
        **metadata,
        "labels": {**labels, **metadata.get("labels", {})},
        "annotations": {**annotations, **metadata.get("annotations", {})},
    }


def client_metadata(cluster: PostgresCluster, metadata: dict[str, Any]) -> dict[str, Any]:
    """A client Service's metadata (-rw, -ro, -r, the pooler's) with spec.services' labels and annotations."""
    spec = cluster.spec.services
    return with_tenant_metadata(metadata, spec.labels, spec.annotations)


def _service(
    cluster: PostgresCluster, name: str, selector: dict[str, str], *, headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [_port(PG_PORT_NAME, PG_PORT)],
        "publishNotReadyAddresses": False,
    }
    metadata = child_metadata(cluster, name, COMPONENT_SERVICE)
    if headless:
        # Pod DNS names must resolve while an instance bootstraps or catches up (not yet ready), and
        # Patroni's REST API is reachable for switchovers and scraping.
        spec.update(
            clusterIP="None",
            publishNotReadyAddresses=True,
            ports=[_port(PG_PORT_NAME, PG_PORT), _port(PATRONI_PORT_NAME, PATRONI_PORT)],
        )
    else:
        metadata = client_metadata(cluster, metadata)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def target_selector(cluster: PostgresCluster, target: str) -> dict[str, str]:
    """The pods an additional Service of this target routes to: the same as the operator's Service."""
    pods = selector_labels(cluster)
    if target == "rw":
        return {**pods, ROLE_LABEL: ROLE_PRIMARY}
    if target == "ro":
        return {**pods, ROLE_LABEL: ROLE_REPLICA}
    if target == "r":
        return pods
    return pooler_pod_labels(cluster.name, target.removeprefix("pooler-"))


def additional_service(cluster: PostgresCluster, extra: AdditionalService) -> dict[str, Any]:
    pooled = extra.target.startswith("pooler-")
    port = _port(POOLER_PORT_NAME, POOLER_PORT) if pooled else _port(PG_PORT_NAME, PG_PORT)
    if extra.node_port is not None:
        port["nodePort"] = extra.node_port
    spec: dict[str, Any] = {
        "type": extra.type,
        "selector": target_selector(cluster, extra.target),
        "ports": [port],
        "externalTrafficPolicy": extra.external_traffic_policy,
    }
    if extra.load_balancer_source_ranges:
        spec["loadBalancerSourceRanges"] = list(extra.load_balancer_source_ranges)
    shared = cluster.spec.services
    metadata = with_tenant_metadata(
        child_metadata(cluster, extra.name, COMPONENT_EXPOSURE),
        {**shared.labels, **extra.labels},
        {**shared.annotations, **extra.annotations},
    )
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def assigned_addresses(cluster: PostgresCluster, observed: Iterable[Mapping[str, Any]]) -> list[str]:
    """The addresses and host names load balancers assigned to the cluster's additional Services, as
    observed (`status.loadBalancer.ingress`): the server certificate names them too. Only Services the
    cluster declares are read (the caller passes the cluster's own)."""
    declared = set(additional_service_names(cluster))
    out: list[str] = []
    for service in observed:
        if (service.get("metadata") or {}).get("name") not in declared:
            continue
        for ingress in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or ():
            for key in ("ip", "hostname"):
                value = ingress.get(key)
                if isinstance(value, str) and value and host_problem(value) is None and value not in out:
                    out.append(value)
    return sorted(out)[:MAX_HOSTS]


def additional_service_names(cluster: PostgresCluster) -> list[str]:
    return [extra.name for extra in cluster.spec.services.additional]


def services(cluster: PostgresCluster) -> list[dict[str, Any]]:
    pods = selector_labels(cluster)
    return [
        _service(cluster, names.headless_service(cluster), pods, headless=True),
        _service(cluster, names.rw_service(cluster), {**pods, ROLE_LABEL: ROLE_PRIMARY}),
        _service(cluster, names.ro_service(cluster), {**pods, ROLE_LABEL: ROLE_REPLICA}),
        _service(cluster, names.r_service(cluster), pods),
        *(additional_service(cluster, extra) for extra in cluster.spec.services.additional),
    ]
