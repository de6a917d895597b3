"""Pure parts of a reconcile pass: the status patch, the StorageClass check, what to delete, the write
memo, and which pod changes wake a cluster."""

from __future__ import annotations

import json
from typing import Any

from pg_operator.controller.cache import Snapshot
from pg_operator.controller.reconcile import undesired_children
from pg_operator.controller.reconcilers.storage import storage_class_problem
from pg_operator.controller.wakeups import relevance
from pg_operator.controller.writes import WriteMemo, status_patch

UID = "c-uid"


def owned(kind: str, name: str, api_version: str = "v1", uid: str = UID, **meta: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "name": "db",
        "uid": uid,
        "controller": True,
    }
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "ownerReferences": [ref], **meta},
    }


def test_status_patch_sets_everything_and_nulls_what_went_away() -> None:
    previous = {"phase": "Scaling 3 → 5", "readyReplicas": 3, "old": "x"}
    desired = {"phase": "Healthy", "readyReplicas": 5}
    assert status_patch(previous, desired) == {
        "status": {"phase": "Healthy", "readyReplicas": 5, "old": None}
    }
    assert status_patch(None, desired) == {"status": desired}


def test_missing_storage_class_is_a_problem_only_when_named_and_known_absent() -> None:
    snap = Snapshot(cluster=None, storage_classes=frozenset({"standard"}), storage_classes_known=True)
    assert storage_class_problem({"storageClassName": "standard"}, snap) is None
    assert storage_class_problem({}, snap) is None  # the default class
    problem = storage_class_problem({"storageClassName": "fast"}, snap)
    assert problem is not None and problem[0] == "StorageClassNotFound" and "'fast'" in problem[1]
    unknown = Snapshot(cluster=None, storage_classes_known=False)  # index not there: do not guess
    assert storage_class_problem({"storageClassName": "fast"}, unknown) is None


def test_only_owned_undesired_live_children_of_managed_kinds_are_deleted() -> None:
    pdb = owned("PodDisruptionBudget", "db", "policy/v1")
    svc = owned("Service", "db-rw")
    foreign = owned("Service", "db-other", uid="another-cluster")
    going = owned("Service", "db-old", deletionTimestamp="2026-01-01T00:00:00Z")
    unmanaged = owned("Pod", "db-0")
    snap = Snapshot(
        cluster=None,
        children={
            ("policy/v1", "PodDisruptionBudget"): [pdb],
            ("v1", "Service"): [svc, foreign, going],
            ("v1", "Pod"): [unmanaged],
        },
    )
    managed = [("policy/v1", "PodDisruptionBudget"), ("v1", "Service")]
    wanted = {("v1", "Service", "db-rw")}
    assert undesired_children(snap, UID, managed, wanted) == [pdb]


def test_write_memo_suppresses_a_repeat_until_the_index_moves_on() -> None:
    memo = WriteMemo(ttl=30)
    ident = ("ns", "Service", "db-rw", "apply")
    assert not memo.pending(ident, "5", "h1")
    memo.wrote(ident, "5", "h1")
    assert memo.pending(ident, "5", "h1")  # the cache still shows what we saw before writing
    assert not memo.pending(ident, "5", "h2")  # something else to write: do it
    assert not memo.pending(ident, "6", "h1")  # the cache caught up: compare afresh
    assert not memo.pending(ident, "5", "h1")  # ... and the entry is gone


def test_write_memo_forgets_a_write_once_the_cache_shows_it() -> None:
    memo = WriteMemo(ttl=30)
    ident = ("ns", "ConfigMap", "db-instance", "apply")
    memo.wrote(ident, None, "h1")  # created: the cache had no such object
    assert memo.pending(ident, None, "h1")  # a quick second pass before the watch shows it: skip
    memo.seen(ident)  # a pass found it as wanted
    # Deleted soon after (by someone, or found gone after a relist): created again, not taken for ours.
    assert not memo.pending(ident, None, "h1")


def test_write_memo_entries_expire() -> None:
    memo = WriteMemo(ttl=0)
    memo.wrote(("ns", "Secret", "db-app", "create"), None, "")
    assert not memo.pending(("ns", "Secret", "db-app", "create"), None, "")


def pod(**status: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "db-0", "labels": {"role": "replica"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], **status},
    }


def test_pod_changes_that_matter_for_status_are_seen_others_are_not() -> None:
    base = pod()
    patroni_annotation = pod()
    patroni_annotation["metadata"]["annotations"] = {"status": '{"xlog_location": 123}'}
    assert relevance(base) == relevance(patroni_annotation)
    promoted = pod()
    promoted["metadata"]["labels"]["role"] = "primary"
    assert relevance(promoted) != relevance(base)
    unready = pod(conditions=[{"type": "Ready", "status": "False"}])
    assert relevance(unready) != relevance(base)


def test_a_pending_restart_wakes_the_cluster_other_patroni_updates_do_not() -> None:
    moving = pod()
    moving["metadata"]["annotations"] = {"status": '{"xlog_location": 456}'}
    waiting = pod()
    waiting["metadata"]["annotations"] = {
        "status": json.dumps(
            {
                "xlog_location": 789,
                "pending_restart": True,
                "pending_restart_reason": {"shared_buffers": {"old_value": "128MB", "new_value": "64MB"}},
            }
        )
    }
    assert relevance(moving) == relevance(pod())
    assert relevance(waiting) != relevance(moving)
