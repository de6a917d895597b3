"""The high-availability sub-reconciler on stand-ins (no cluster, no Patroni): a primary whose database
container the kubelet reports dead has its leader key released at once so a replica takes over, once;
a requested switchover to a pod that is no instance is refused and the request cleared."""

from __future__ import annotations

import asyncio
from typing import Any

from reconciler_fakes import FakeApi, RecordedEvents, context, instance_pod, owned

from pg_operator.controller.reconcilers.high_availability import (
    SWITCHOVER_ANNOTATION,
    HighAvailabilityReconciler,
)

STATEFULSET = {"spec": {"replicas": 2}}


def leader(holder: str) -> dict[str, Any]:
    """Patroni's leader key, adopted by the cluster already (so only the key's release is written)."""
    return owned("ConfigMap", "orders-db-leader", metadata={"annotations": {"leader": holder, "ttl": "30"},
                                                            "resourceVersion": "42"})  # fmt: skip


def test_a_dead_primary_s_leader_key_is_released_for_a_replica() -> None:
    api, events = FakeApi(), RecordedEvents()
    ha = HighAvailabilityReconciler(api, events)  # type: ignore[arg-type]
    pods = [instance_pod("orders-db-0", "primary", down=True), instance_pod("orders-db-1")]
    ctx = context([*pods, leader("orders-db-0")], statefulset=STATEFULSET)
    asyncio.run(ha.act(ctx))
    released = [patch for name, patch in api.patched if name == "orders-db-leader"]
    assert len(released) == 1
    assert released[0]["metadata"]["resourceVersion"] == "42"  # only the key that was read
    assert events.reasons() == ["FailoverStarted"] and "orders-db-0" in events.posted[0][2]


def test_a_live_primary_or_no_viable_replica_keeps_the_key() -> None:
    for pods in (
        [instance_pod("orders-db-0", "primary"), instance_pod("orders-db-1")],
        [instance_pod("orders-db-0", "primary", down=True), instance_pod("orders-db-1", down=True)],
    ):
        api, events = FakeApi(), RecordedEvents()
        asyncio.run(HighAvailabilityReconciler(api, events).act(  # type: ignore[arg-type]
            context([*pods, leader("orders-db-0")], statefulset=STATEFULSET)))  # fmt: skip
        assert [n for n, _ in api.patched if n == "orders-db-leader"] == []
        assert "FailoverStarted" not in events.reasons()


def test_a_switchover_to_a_pod_that_is_no_instance_is_refused_and_cleared() -> None:
    api, events = FakeApi(), RecordedEvents()
    ha = HighAvailabilityReconciler(api, events)  # type: ignore[arg-type]
    pods = [instance_pod("orders-db-0", "primary"), instance_pod("orders-db-1")]
    ctx = context(pods, statefulset=STATEFULSET, annotations={SWITCHOVER_ANNOTATION: "orders-db-7"})
    asyncio.run(ha.act(ctx))
    assert ("orders-db", {"metadata": {"annotations": {SWITCHOVER_ANNOTATION: None}}}) in api.patched
    refused = [message for _, reason, message in events.posted if reason == "SwitchoverRefused"]
    assert len(refused) == 1 and "orders-db-7 is not an instance" in refused[0]
