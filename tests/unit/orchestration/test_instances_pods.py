"""Which pods are a cluster's instances: only those its own StatefulSet controls, under a member's name."""

from __future__ import annotations

from typing import Any

from pg_operator.orchestration.instance_pods import (
    controls,
    foreign_pod_message,
    instance_pods,
    may_be_instance,
    member_ordinal,
)

CLUSTER_UID = "cluster-uid"
STS_UID = "sts-uid"


def ref(
    kind: str, uid: str, name: str = "db", api_version: str = "apps/v1", controller: bool = True
) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


def statefulset(owner_uid: str = CLUSTER_UID) -> dict[str, Any]:
    owner = ref("PostgresCluster", owner_uid, api_version="db.example.com/v1alpha1")
    return {"metadata": {"name": "db", "uid": STS_UID, "ownerReferences": [owner]}}


def pod(name: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"db.example.com/cluster": "db", "role": "primary"},
            "ownerReferences": list(refs),
        }
    }


def test_member_names_are_those_the_statefulset_gives() -> None:
    assert member_ordinal("db-0", "db") == 0
    assert member_ordinal("db-4", "db") == 4
    for name in ("db-5", "db-00", "db-01", "db-x", "db-", "db", "other-0", "db-0-x", "db-\u0661"):
        assert member_ordinal(name, "db") is None, name


def test_the_statefulsets_own_pods_are_the_instances_and_look_alikes_are_foreign() -> None:
    ours = pod("db-0", ref("StatefulSet", STS_UID))
    unowned = pod("a-imposter")
    forged_elsewhere = pod("a-forged", ref("StatefulSet", STS_UID))  # the right uid, not a member's name
    other_sts = pod("db-1", ref("StatefulSet", "another-sts"))
    not_controller = pod("db-2", ref("StatefulSet", STS_UID, controller=False))
    replicaset = pod("db-3", ref("ReplicaSet", STS_UID))
    split = instance_pods(
        [ours, unowned, forged_elsewhere, other_sts, not_controller, replicaset], statefulset(), CLUSTER_UID
    )
    assert split.ours == (ours,)
    assert split.foreign == ("a-forged", "a-imposter", "db-1", "db-2", "db-3")


def test_without_the_clusters_own_statefulset_nothing_is_an_instance_and_nothing_is_called_foreign() -> None:
    ours = pod("db-0", ref("StatefulSet", STS_UID))
    assert instance_pods([ours], None, CLUSTER_UID).ours == ()
    foreign_sts = statefulset(owner_uid="someone-else")  # a StatefulSet named like ours, not the cluster's
    assert not controls(foreign_sts, CLUSTER_UID)
    assert instance_pods([ours], foreign_sts, CLUSTER_UID) == instance_pods([], None, CLUSTER_UID)
    assert not controls(statefulset(), "")


def test_the_cache_keeps_only_pods_a_statefulset_controls_under_a_members_name() -> None:
    assert may_be_instance(pod("db-2", ref("StatefulSet", "any")), "db")
    assert not may_be_instance(pod("db-2"), "db")
    assert not may_be_instance(pod("db-2", ref("StatefulSet", "any", api_version="v1")), "db")
    assert not may_be_instance(pod("a-imposter", ref("StatefulSet", "any")), "db")


def test_the_warning_names_the_pod_and_the_statefulset() -> None:
    message = foreign_pod_message("a-imposter", "db")
    assert "pod a-imposter" in message and "StatefulSet db" in message
