"""The multi-node sub-tier's shared cluster (tests/e2e/nodes/conftest.py `nodes_cluster`): three
instances, synchronous, a pooler, zones spread as required — one per node on the three-node profile —
and the waits that read only the API (the host reaches no Service address on a multi-node profile, so
pgcluster.wait_serving's connection through `-rw` cannot be made from it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import SMALL, healthy, status
from harness.waiting import wait_until

NAMESPACE, NAME = "nodes-ha", "spread-db"
POOLER = {"instances": 2, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}}
SPEC: dict[str, Any] = {
    "replicas": 3,
    "resources": SMALL,
    "synchronous": {"number": 1},
    "pooler": POOLER,
    "affinity": {"zoneSpread": "required"},
}


@dataclass(frozen=True)
class NodesCluster:
    kube: Kube
    namespace: str
    name: str

    def primary(self) -> str:
        return str(status(self.kube, self.namespace, self.name)["currentPrimary"])

    def pods(self) -> dict[str, dict[str, Any]]:
        items = get_json(self.kube, "pods", "-n", self.namespace, "-l", f"db.example.com/cluster={self.name}")
        return {p["metadata"]["name"]: p for p in items["items"]}

    def node_of(self, pod: str) -> str:
        return str(self.pods()[pod]["spec"].get("nodeName") or "")

    def condition(self, kind: str) -> dict[str, Any]:
        conds = status(self.kube, self.namespace, self.name).get("conditions") or ()
        return next((dict(c) for c in conds if c["type"] == kind), {})

    def pooler_pointing_at(self, primary: str) -> bool:
        cond = self.condition("Pooler")
        return cond.get("status") == "True" and f"{primary}.{self.name}.{self.namespace}.svc" in str(
            cond.get("message", "")
        )

    def serving(self, timeout: float = 900) -> str:
        """Every instance Ready with one primary, Ready (-rw routes to it), the pooler on it: the
        primary's name."""
        st = wait_until(
            f"{self.name} healthy", lambda: healthy(self.kube, self.namespace, self.name, 3), timeout, 2
        )
        wait_until(f"{self.name} Ready", lambda: self.condition("Ready").get("status") == "True", 300, 2)
        primary = str(st["currentPrimary"])
        wait_until("the pooler on the primary", lambda: self.pooler_pointing_at(primary), 300, 2)
        return primary
