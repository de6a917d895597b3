"""The major-upgrade sub-reconciler's views of the cluster: the running major and image from the StatefulSet,
the cluster held at them, the backup generation its children archive to or restore from, and the pods
around the new major's start. (The state, its annotation and the transitions: test_major_upgrade_state.py
under tests/unit/orchestration.)"""

from __future__ import annotations

import json
from typing import Any

from harness.objects import cluster_model
from pg_operator.orchestration.major_upgrade_views import (
    at_major,
    running_image,
    running_major,
    with_archive_server,
    with_recovery_server,
)
from pg_operator.specs.statefulset import statefulset


def test_running_major_and_image_are_the_statefulsets() -> None:
    assert running_major(None) is None and running_image(None) is None
    assert running_major(statefulset(cluster_model(version="16"))) == "16"
    pinned = statefulset(cluster_model(version="16", image="registry.example/pg:16.9"))
    assert running_image(pinned) == "registry.example/pg:16.9"


def test_held_at_the_running_major_builds_that_majors_statefulset() -> None:
    wanted = cluster_model(version="17", image="registry.example/pg:17")
    held = at_major(wanted, "16")
    assert held.spec.version == "16" and held.spec.image is None and held.name == wanted.name
    assert wanted.spec.version == "17"  # the pass's copy changes, the parsed spec does not
    assert running_major(statefulset(held)) == "16"
    assert at_major(wanted, "17", "registry.example/pg:17") is wanted
    # Held with the image that runs (a pinned old image is not swapped for the default meanwhile) ...
    running = at_major(wanted, "16", "registry.example/pg:16.9")
    assert running_image(statefulset(running)) == "registry.example/pg:16.9"
    # ... and once the data is on the new major, with the upgrade's image.
    assert at_major(wanted, "17").spec.image is None


BACKUP = {"s3": {"bucket": "backups", "path": "prod", "endpointURL": "http://s3.local:9000",
                 "credentials": {"secretName": "s3"}}}  # fmt: skip


def _archive_prefix(cluster: Any) -> str:
    from pg_operator.specs.configmap import instance_config

    section = instance_config(cluster).backup
    assert section is not None
    return f"{section['archive']['store']['path']}/{section['archive']['store']['serverName']}"


def test_after_the_switch_every_child_archives_to_the_new_generation() -> None:
    cluster = cluster_model(version="17", backup=BACKUP)
    assert _archive_prefix(cluster) == "prod/orders-db"
    moved = with_archive_server(cluster, "orders-db-pg17")
    assert _archive_prefix(moved) == "prod/orders-db-pg17"
    assert with_archive_server(cluster, "orders-db") is cluster
    # The pods roll with the new archive settings: the backup digest on the template changes.
    key = "db.example.com/backup-config"

    def digest(c: Any) -> str:
        return str(statefulset(c)["spec"]["template"]["metadata"]["annotations"][key])

    assert digest(moved) != digest(cluster)
    # Not part of the API: the CRD never carries it, so no user can set it.
    assert "generationServerName" not in json.dumps(cluster.spec.model_dump(by_alias=True, exclude_none=True))


def test_a_restore_reads_the_chosen_generation_of_its_source() -> None:
    from pg_operator.specs.configmap import instance_config

    recovery = {"source": {"clusterName": "orders-db", **BACKUP}, "targetTime": "2026-12-02T21:00:00Z"}
    restored = cluster_model("restored", version="16", bootstrap={"recovery": recovery})
    moved = with_recovery_server(restored, "orders-db-pg17")
    section = instance_config(moved).backup
    assert section is not None and section["recovery"]["source"]["serverName"] == "orders-db-pg17"
    assert with_recovery_server(restored, "orders-db") is restored


def test_a_replicas_pod_waits_until_the_primarys_is_recreated() -> None:
    from pg_operator.orchestration.instances import instance_from_pod
    from pg_operator.orchestration.major_upgrade_state import pods_to_recreate, replaced

    def pod(name: str, image: str, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-03T06:00:00Z"
        return {"metadata": meta, "spec": {"containers": [{"name": "postgres", "image": image}]}}

    new, old = "localhost/pg-operator/postgres:17.11", "localhost/pg-operator/postgres:16.15"
    before = [instance_from_pod(pod("orders-db-0", old)), instance_from_pod(pod("orders-db-1", old))]
    going = [instance_from_pod(pod("orders-db-0", old, deleting=True)), before[1]]
    after = [instance_from_pod(pod("orders-db-0", new)), before[1]]
    assert not replaced(before, "orders-db-0", new)
    assert not replaced(going, "orders-db-0", new)
    assert replaced(after, "orders-db-0", new)
    assert not replaced(after, "orders-db-1", new)
    # The follow-up deletes the primary's pod first, the replica's once the primary's is recreated.
    assert pods_to_recreate(before, "orders-db-0", new) == ["orders-db-0"]
    assert pods_to_recreate(going, "orders-db-0", new) == []
    assert pods_to_recreate(after, "orders-db-0", new) == ["orders-db-1"]


def test_the_new_primary_is_whichever_instance_of_the_new_image_leads() -> None:
    from pg_operator.orchestration.instances import instance_from_pod
    from pg_operator.orchestration.major_upgrade_state import new_primary

    def pod(name: str, image: str, role: str, ready: bool = True) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"role": role}},
                "spec": {"containers": [{"name": "postgres", "image": image}]},
                "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip

    new, old = "localhost/pg-operator/postgres:17.11", "localhost/pg-operator/postgres:16.15"
    # Patroni's race after the resume went to a seeded replica (the same data as the upgraded primary).
    raced = [instance_from_pod(pod("db-2", new, "replica")), instance_from_pod(pod("db-1", new, "primary"))]
    leader = new_primary(raced, new)
    assert leader is not None and leader.name == "db-1"
    # Not yet: nobody leads, the leader is not ready, or only a pod of the old image says primary.
    assert new_primary([instance_from_pod(pod("db-2", new, "replica"))], new) is None
    assert new_primary([instance_from_pod(pod("db-2", new, "primary", ready=False))], new) is None
    assert new_primary([instance_from_pod(pod("db-2", old, "primary"))], new) is None


def test_every_phase_but_done_has_its_step() -> None:
    from pg_operator.controller.reconcilers.major_upgrade_steps import STEPS
    from pg_operator.orchestration.major_upgrade_state import Phase

    assert set(STEPS) == set(Phase) - {Phase.DONE}
