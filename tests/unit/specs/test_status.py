"""compute_status: phases, conditions, and lastTransitionTime kept while a condition's status holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harness.objects import cluster_model
from harness.pods import cluster_pod as pod
from harness.pods import statefulset as sts
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.cluster_status import PostgresClusterStatus
from pg_operator.specs import compute_status

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)
T2 = T0 + timedelta(minutes=2)


def cluster(replicas: int = 3, generation: int = 2) -> PostgresCluster:
    return cluster_model(replicas=replicas, generation=generation)


def healthy_pods() -> list[dict[str, Any]]:
    return [pod(1), pod(0, "primary"), pod(2)]


def rw_slice(*pods: str, ready: bool | None = True, service: str = "orders-db-rw") -> dict[str, Any]:
    """An EndpointSlice of `service` as the endpointslice controller writes it, listing `pods`."""
    conditions = {} if ready is None else {"ready": ready}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-x1", "labels": {"kubernetes.io/service-name": service}},
        "endpoints": [
            {"addresses": [f"10.0.0.{i}"], "conditions": conditions, "targetRef": {"kind": "Pod", "name": p}}
            for i, p in enumerate(pods)
        ],
    }


ROUTED = [rw_slice("orders-db-0")]


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    (c,) = [c for c in status["conditions"] if c["type"] == type_]
    return c


def summary(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_new_cluster_is_creating() -> None:
    s = compute_status(cluster(), previous=None, statefulset=None, pods=[], now=T0)
    assert s["phase"] == "Creating"
    assert summary(s) == {
        "Ready": ("False", "NoPrimary"),
        "Progressing": ("True", "Creating"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (s["replicas"], s["readyReplicas"], s["currentPrimary"], s["instances"]) == (0, 0, "", [])
    assert s["observedGeneration"] == 2
    assert all(
        c["observedGeneration"] == 2 and c["lastTransitionTime"] == "2026-12-01T08:00:00Z"
        for c in s["conditions"]
    )


def test_creating_until_every_instance_is_ready_then_healthy() -> None:
    s0 = compute_status(cluster(), previous=None, statefulset=None, pods=[], now=T0)
    partial = [pod(0, "primary"), pod(1, None, ready=False), pod(2, ready=False)]
    s1 = compute_status(cluster(), previous=s0, statefulset=sts(), pods=partial, now=T1)
    assert s1["phase"] == "Creating" and s1["readyReplicas"] == 1
    assert cond(s1, "Degraded")["status"] == "False"
    s2 = compute_status(
        cluster(), previous=s1, statefulset=sts(), pods=healthy_pods(), now=T2, endpoint_slices=ROUTED
    )
    assert s2["phase"] == "Healthy"
    assert summary(s2) == {
        "Ready": ("True", "AllInstancesReady"),
        "Progressing": ("False", "Reconciled"),
        "Degraded": ("False", "AsExpected"),
    }
    assert cond(s2, "Ready")["lastTransitionTime"] == "2026-12-01T08:02:00Z"
    assert cond(s2, "Degraded")["lastTransitionTime"] == "2026-12-01T08:00:00Z"  # still False since T0
    assert s2["currentPrimary"] == "orders-db-0" and (s2["replicas"], s2["readyReplicas"]) == (3, 3)
    assert s2["instances"] == [
        {"name": "orders-db-0", "role": "primary", "ready": True},
        {"name": "orders-db-1", "role": "replica", "ready": True},
        {"name": "orders-db-2", "role": "replica", "ready": True},
    ]


def healthy_at(now: datetime) -> dict[str, Any]:
    s0 = compute_status(
        cluster(), previous=None, statefulset=sts(), pods=healthy_pods(), now=now, endpoint_slices=ROUTED
    )
    assert s0["phase"] == "Healthy"
    return s0


def test_equal_input_gives_an_equal_status_and_times_are_kept() -> None:
    s0 = healthy_at(T0)
    again = compute_status(
        cluster(), previous=s0, statefulset=sts(), pods=healthy_pods(), now=T2, endpoint_slices=ROUTED
    )
    assert again == s0


def test_primary_lost_is_degraded_and_only_changed_conditions_move() -> None:
    s0 = healthy_at(T0)
    pods = [pod(0, "primary", ready=False), pod(1), pod(2)]
    s1 = compute_status(cluster(), previous=s0, statefulset=sts(), pods=pods, now=T1)
    assert s1["phase"] == "Degraded: NoPrimary"
    assert summary(s1)["Ready"] == ("False", "NoPrimary") and summary(s1)["Degraded"] == ("True", "NoPrimary")
    assert (
        cond(s1, "Ready")["lastTransitionTime"]
        == cond(s1, "Degraded")["lastTransitionTime"]
        == ("2026-12-01T08:01:00Z")
    )
    assert cond(s1, "Progressing")["lastTransitionTime"] == "2026-12-01T08:00:00Z"
    assert s1["currentPrimary"] == "orders-db-0" and s1["readyReplicas"] == 2
    # Patroni promotes a replica: healthy again, with the new primary.
    failed_over = [pod(0, "replica"), pod(1, "primary"), pod(2)]
    routed_to_1 = [rw_slice("orders-db-1")]
    s2 = compute_status(
        cluster(), previous=s1, statefulset=sts(), pods=failed_over, now=T2, endpoint_slices=routed_to_1
    )
    assert s2["phase"] == "Healthy" and s2["currentPrimary"] == "orders-db-1"
    assert cond(s2, "Ready")["lastTransitionTime"] == "2026-12-01T08:02:00Z"


def test_replica_not_ready_is_degraded() -> None:
    s = compute_status(
        cluster(),
        previous=healthy_at(T0),
        statefulset=sts(),
        pods=[pod(0, "primary"), pod(1, ready=False), pod(2)],
        now=T1,
        endpoint_slices=ROUTED,
    )
    assert s["phase"] == "Degraded: InstancesNotReady"
    assert summary(s)["Degraded"] == ("True", "InstancesNotReady")
    assert cond(s, "Degraded")["message"] == "2 of 3 instances ready"


def test_scaling_up_and_down() -> None:
    up = compute_status(
        cluster(replicas=5, generation=3),
        previous=healthy_at(T0),
        statefulset=sts(5),
        pods=healthy_pods(),
        now=T1,
        endpoint_slices=ROUTED,
    )
    assert up["phase"] == "Scaling 3 → 5"
    assert summary(up) == {
        "Ready": ("False", "InstancesNotReady"),
        "Progressing": ("True", "Scaling"),
        "Degraded": ("False", "AsExpected"),
    }
    assert all(c["observedGeneration"] == 3 for c in up["conditions"])
    down = compute_status(
        cluster(replicas=1),
        previous=healthy_at(T0),
        statefulset=sts(1),
        pods=healthy_pods(),
        now=T1,
        endpoint_slices=ROUTED,
    )
    assert down["phase"] == "Scaling 3 → 1"


def test_outdated_pods_are_updating() -> None:
    pods = [pod(0, "primary", rev="rev1"), pod(1, rev="rev2"), pod(2, rev="rev1")]
    s = compute_status(
        cluster(),
        previous=healthy_at(T0),
        statefulset=sts(update_revision="rev2"),
        pods=pods,
        now=T1,
        endpoint_slices=ROUTED,
    )
    assert s["phase"] == "Updating"
    assert summary(s)["Progressing"] == ("True", "Updating")
    assert cond(s, "Progressing")["message"] == "2 of 3 instances run an outdated pod template"
    assert summary(s)["Ready"] == ("True", "AllInstancesReady")


def test_a_problem_the_controller_found_makes_it_degraded() -> None:
    problem = ("StorageClassMissing", "StorageClass 'fast' does not exist")
    s = compute_status(cluster(), previous=None, statefulset=None, pods=[], now=T0, problem=problem)
    assert s["phase"] == "Degraded: StorageClassMissing"
    assert cond(s, "Degraded") | {"lastTransitionTime": ""} == {
        "type": "Degraded",
        "status": "True",
        "reason": "StorageClassMissing",
        "message": "StorageClass 'fast' does not exist",
        "observedGeneration": 2,
        "lastTransitionTime": "",
    }


def test_only_this_clusters_live_pods_count() -> None:
    foreign = pod(7, "primary")
    foreign["metadata"]["labels"]["db.example.com/cluster"] = "other-db"
    terminating = pod(3, "primary", deletionTimestamp="2026-12-01T08:00:00Z")
    legacy = pod(0, "master")
    unlabelled = pod(1, None, ready=False)
    s = compute_status(
        cluster(replicas=2),
        previous=None,
        statefulset=sts(2),
        pods=[foreign, terminating, legacy, unlabelled],
        now=T0,
    )
    assert [i["name"] for i in s["instances"]] == ["orders-db-0", "orders-db-1"]
    assert s["instances"][0]["role"] == "primary" and s["instances"][1]["role"] == "unknown"
    assert s["currentPrimary"] == "orders-db-0" and s["readyReplicas"] == 1


def test_two_primaries_prefer_the_ready_one() -> None:
    s = compute_status(
        cluster(),
        previous=None,
        statefulset=sts(),
        pods=[pod(0, "primary", ready=False), pod(1, "primary"), pod(2)],
        now=T0,
    )
    assert s["currentPrimary"] == "orders-db-1"


def test_status_matches_the_crd_model_and_naive_times_are_utc() -> None:
    s = compute_status(
        cluster(), previous=None, statefulset=sts(), pods=healthy_pods(), now=datetime(2026, 12, 1, 8)
    )
    parsed = PostgresClusterStatus.model_validate(s)
    assert parsed.model_dump(by_alias=True, mode="json", exclude_none=True) == s
    assert s["conditions"][0]["lastTransitionTime"] == "2026-12-01T08:00:00Z"
    assert s["selector"] == (
        "app.kubernetes.io/instance=orders-db,app.kubernetes.io/name=postgresql,db.example.com/cluster=orders-db"
    )


def test_instances_report_patroni_timeline_from_the_pod_annotation() -> None:
    pods = [
        pod(0, "primary", annotations={"status": '{"state":"running","role":"primary","timeline":3}'}),
        pod(1, annotations={"status": "not json"}),
    ]
    status = compute_status(cluster(2), previous=None, statefulset=sts(2), pods=pods, now=T0)
    by_name = {i["name"]: i for i in status["instances"]}
    assert by_name["orders-db-0"]["timeline"] == 3
    assert "timeline" not in by_name["orders-db-1"]


def test_ready_waits_for_the_rw_service_to_route_to_the_primary() -> None:
    """Ready only once the -rw Service's EndpointSlice lists the primary as a ready endpoint: no slice
    yet, a slice without the primary, the primary not ready in it, then ready."""
    creating = compute_status(cluster(), previous=None, statefulset=sts(), pods=[], now=T0)
    not_routed = ("False", "PrimaryNotRouted")
    message = "the orders-db-rw Service does not route to orders-db-0 yet"
    for slices in (
        [],
        [rw_slice("orders-db-1", "orders-db-2")],
        [rw_slice("orders-db-0", service="orders-db-ro")],  # another Service's slice
        [rw_slice("orders-db-0", ready=False)],
    ):
        s = compute_status(cluster(), previous=creating, statefulset=sts(), pods=healthy_pods(), now=T1,
                           endpoint_slices=slices)  # fmt: skip
        assert summary(s)["Ready"] == not_routed, slices
        assert cond(s, "Ready")["message"] == message
        assert s["phase"] == "Creating" and summary(s)["Progressing"] == ("True", "Creating")
        assert summary(s)["Degraded"] == ("False", "AsExpected")  # still being created: not degraded
        assert s["readyReplicas"] == 3
    for slices in ([rw_slice("orders-db-1", "orders-db-0")], [rw_slice("orders-db-0", ready=None)]):
        s = compute_status(cluster(), previous=creating, statefulset=sts(), pods=healthy_pods(), now=T1,
                           endpoint_slices=slices)  # fmt: skip
        assert summary(s)["Ready"] == ("True", "AllInstancesReady"), slices
        assert s["phase"] == "Healthy"


def test_an_endpoint_without_an_address_does_not_route() -> None:
    no_address = rw_slice("orders-db-0")
    no_address["endpoints"][0]["addresses"] = []
    s = compute_status(
        cluster(), previous=None, statefulset=sts(), pods=healthy_pods(), now=T0, endpoint_slices=[no_address]
    )
    assert summary(s)["Ready"] == ("False", "PrimaryNotRouted")


def test_a_new_primary_not_routed_yet_is_degraded_until_the_slice_follows() -> None:
    """After a failover the pods say orders-db-1 is primary before the slice does."""
    failed_over = [pod(0, "replica"), pod(1, "primary"), pod(2)]
    s = compute_status(cluster(), previous=healthy_at(T0), statefulset=sts(), pods=failed_over, now=T1,
                       endpoint_slices=ROUTED)  # fmt: skip
    assert s["phase"] == "Degraded: PrimaryNotRouted"
    assert summary(s)["Ready"] == ("False", "PrimaryNotRouted")
    assert cond(s, "Degraded")["message"] == "the orders-db-rw Service does not route to orders-db-1 yet"
    routed = compute_status(
        cluster(), previous=s, statefulset=sts(), pods=failed_over, now=T2,
        endpoint_slices=[rw_slice("orders-db-1")],
    )  # fmt: skip
    assert routed["phase"] == "Healthy" and summary(routed)["Degraded"] == ("False", "AsExpected")


def test_a_failed_pass_report_does_not_end_creation() -> None:
    """The failure report replaces the phase and Degraded only; the next good pass still sees the
    cluster as being created (Progressing says so) rather than as a degraded running one."""
    creating = compute_status(cluster(), previous=None, statefulset=sts(), pods=[], now=T0)
    reported = dict(creating, phase="Degraded: ReconcileFailed")
    s = compute_status(
        cluster(), previous=reported, statefulset=sts(), pods=[pod(0, "primary"), pod(1, ready=False)], now=T1
    )
    assert s["phase"] == "Creating" and summary(s)["Degraded"] == ("False", "AsExpected")
    only_degraded = {"phase": "Degraded: ReconcileFailed", "conditions": [cond(reported, "Degraded")]}
    s = compute_status(cluster(), previous=only_degraded, statefulset=sts(), pods=[], now=T1)
    assert s["phase"] == "Creating"
