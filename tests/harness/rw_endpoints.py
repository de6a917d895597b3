"""A writing client for clusters on the multi-node full profile, where the host runs no kube-proxy and so
cannot use a Service's ClusterIP: it connects where kube-proxy would send it, to the ready addresses of
the `<cluster>-rw` Service's EndpointSlices, read again whenever it has to reconnect."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from harness.local_cluster import Kube
from harness.pgcluster import Writer

# How long a reading of the endpoints is reused while connections succeed.
ENDPOINTS_FRESH_S = 2.0


def rw_addresses(kube: Kube, namespace: str, cluster: str) -> list[str]:
    """The ready addresses the -rw Service routes to now (kube-proxy's view of it)."""
    selector = f"kubernetes.io/service-name={cluster}-rw"
    res = kube.kubectl(
        "get", "endpointslices", "-n", namespace, "-l", selector, "-o", "json", check=False, timeout=20
    )
    if res.returncode != 0:
        return []
    out = []
    for item in json.loads(res.stdout).get("items") or []:
        for endpoint in item.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready", True) is not False:
                out += endpoint.get("addresses") or []
    return out


class EndpointWriter(Writer):
    """The Writer (harness/pgcluster.py), connecting to the -rw Service's ready endpoints in turn, as a
    client inside the cluster reaches them through kube-proxy; by default keeps one connection
    (`persistent`), as an application's pool does."""

    def __init__(
        self, kube: Kube, namespace: str, cluster: str, table: str, *, persistent: bool = True
    ) -> None:
        self._addresses: list[str] = []
        self._read_at = 0.0
        self._kube_for_endpoints, self._ns, self._name = kube, namespace, cluster
        super().__init__(kube, namespace, cluster, table, persistent=persistent)

    def _connect(self) -> psycopg.Connection[Any]:
        if not self._addresses or time.monotonic() - self._read_at > ENDPOINTS_FRESH_S:
            self._addresses = rw_addresses(self._kube_for_endpoints, self._ns, self._name)
            self._read_at = time.monotonic()
        if not self._addresses:
            raise psycopg.OperationalError(f"{self._name}-rw has no ready endpoint")
        failure: psycopg.Error | None = None
        for address in list(self._addresses):
            self._host = address
            try:
                return super()._connect()
            except psycopg.Error as exc:
                failure = exc
        self._addresses = []  # read them again on the next attempt
        assert failure is not None
        raise failure
