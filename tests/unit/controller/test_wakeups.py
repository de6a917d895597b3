"""Which watch events wake a cluster: the -rw Service's EndpointSlice when what it routes to changes,
no other Service's slice."""

from __future__ import annotations

import json
from typing import Any

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cache import Cache, watched_kinds
from pg_operator.controller.loop import ReconcileLoop, Result
from pg_operator.controller.wakeups import Wakeups, relevance, routing
from pg_operator.specs import MANAGED_KINDS

KEY = ("shop", "db")


class Idle:
    async def reconcile(self, key: tuple[str, str]) -> Result:
        return Result()


def endpoint_slice(service: str, *pods: str, ready: bool = True, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-x", "namespace": "shop", "uid": f"uid-{service}",
                     "resourceVersion": rv,
                     "labels": {CLUSTER_LABEL: "db", "kubernetes.io/service-name": service},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                          "uid": "s", "controller": True}]},
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
                       "targetRef": {"kind": "Pod", "name": p}} for p in pods],
    }  # fmt: skip


def wakeups() -> tuple[Wakeups, ReconcileLoop[tuple[str, str]]]:
    loop: ReconcileLoop[tuple[str, str]] = ReconcileLoop(Idle(), status_delay=1.0)
    return Wakeups(loop, Cache(watched_kinds(MANAGED_KINDS))), loop


async def test_the_rw_slice_wakes_its_cluster_when_what_it_routes_to_changes() -> None:
    w, loop = wakeups()
    w.on_child(endpoint_slice("db-rw", "db-0", ready=False), "ADDED")
    assert 0.9 < (loop.queue.pending_delay(KEY) or 0) <= 1.0  # folded with the pods' news
    loop.queue = type(loop.queue)()
    w.on_child(endpoint_slice("db-rw", "db-0", ready=False, rv="2"), "MODIFIED")
    assert loop.queue.pending_delay(KEY) is None  # routes as before: no pass
    w.on_child(endpoint_slice("db-rw", "db-0", rv="3"), "MODIFIED")
    assert loop.queue.pending_delay(KEY) is not None
    loop.queue = type(loop.queue)()
    w.on_child(endpoint_slice("db-rw", "db-0", rv="4"), "DELETED")
    assert loop.queue.pending_delay(KEY) is not None


async def test_the_other_services_slices_wake_nobody() -> None:
    w, loop = wakeups()
    for service in ("db", "db-ro", "db-r"):
        w.on_child(endpoint_slice(service, "db-1"), "ADDED")
    assert loop.queue.pending_delay(KEY) is None and len(loop.queue) == 0


def test_routing_is_what_ready_reads_in_a_stable_order() -> None:
    one = endpoint_slice("db-rw", "db-0", "db-1")
    other = endpoint_slice("db-rw", "db-1", "db-0", rv="9")
    assert routing(one) == routing(other)
    assert routing(one) != routing(endpoint_slice("db-rw", "db-0", "db-1", ready=False))


def test_a_pod_loading_new_tls_files_is_relevant_and_patronis_heartbeat_is_not() -> None:
    def pod(status: dict[str, object]) -> dict[str, object]:
        return {"kind": "Pod", "metadata": {"name": "db-0", "annotations": {"status": json.dumps(status)}},
                "status": {"phase": "Running", "podIP": "10.0.0.5"}}  # fmt: skip

    base = {"state": "running", "role": "replica", "xlog_location": 100, "tags": {"pgop_tls": "aaaa"}}
    assert relevance(pod(base)) == relevance(pod({**base, "xlog_location": 200}))  # every loop: no wake
    assert relevance(pod(base)) != relevance(pod({**base, "tags": {"pgop_tls": "bbbb"}}))
    assert relevance(pod({**base, "tags": "junk"})) == relevance(pod({**base, "tags": {}}))
