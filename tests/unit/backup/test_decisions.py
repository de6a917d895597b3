"""The backup controller's pure decisions: placement, the Backup lifecycle, schedules, the archiving
condition, the finalizer, and the conditions merge. Plain dicts in, plain values out."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from pg_operator.backup.archive_health import (
    archiving_condition,
    archiving_summary,
    last_backup_condition,
    parse_archiver_line,
)
from pg_operator.backup.failures import classify
from pg_operator.backup.jobs import JobState
from pg_operator.backup.lifecycle import after_poll, before_start, reason_of
from pg_operator.backup.placement import Placement, choose_instance, primary_pod
from pg_operator.backup.scheduling import backup_name, schedule_pass
from pg_operator.backup.store_cleanup import FINALIZER, RELEASE_ANNOTATION, decide_finalizer
from pg_operator.controller.backup_reconcilers.cluster_status import merged_conditions
from pg_operator.controller.pod_exec import ExecError, exec_url, exit_status_of

T0 = dt.datetime(2026, 12, 1, 8, 0, 0, tzinfo=dt.UTC)


def pod(name: str, role: str, *, ready: bool = True, timeline: int = 1, state: str = "running",
        replication: str | None = "streaming", cluster: str = "db") -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {"state": state, "timeline": timeline, "role": role}
    if replication is not None and role == "replica":
        status["replication_state"] = replication
    return {
        "metadata": {"name": name, "labels": {"db.example.com/cluster": cluster, "role": role},
                     "annotations": {"status": json.dumps(status)}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }  # fmt: skip


# --- placement ------------------------------------------------------------------------------------


def test_a_streaming_replica_takes_the_backup() -> None:
    pods = [pod("db-0", "primary"), pod("db-2", "replica"), pod("db-1", "replica")]
    assert choose_instance(pods, "db") == Placement("db-1", "replica", "a healthy replica takes it")


def test_unfit_replicas_leave_it_to_the_primary() -> None:
    pods = [
        pod("db-0", "primary", timeline=2),
        pod("db-1", "replica", ready=False, timeline=2),
        pod("db-2", "replica", replication="in archive recovery", timeline=2),
        pod("db-3", "replica", timeline=1),  # still on the old timeline after a failover
        pod("db-4", "replica", cluster="other", timeline=2),
    ]
    chosen = choose_instance(pods, "db")
    assert chosen is not None and (chosen.pod, chosen.role) == ("db-0", "primary")
    assert "no ready, streaming replica" in chosen.reason
    assert primary_pod(pods, "db") == "db-0"


def test_no_ready_instance_means_no_placement() -> None:
    assert choose_instance([pod("db-0", "primary", ready=False)], "db") is None
    assert primary_pod([pod("db-0", "primary", ready=False)], "db") is None


# --- lifecycle ------------------------------------------------------------------------------------


CLUSTER = {"metadata": {"name": "db"}, "spec": {"backup": {"s3": {"bucket": "b"}}}}
STAMP = "2026-12-01T08:00:00Z"


def test_new_backup_starts_on_the_placement_and_records_it() -> None:
    step = before_start({}, cluster=CLUSTER, placement=Placement("db-1", "replica", "r"), now_stamp=STAMP)
    assert step.kind == "start" and step.pod == "db-1"
    assert step.status == {"phase": "Running", "instance": "db-1", "startedAt": STAMP, "error": None}


@pytest.mark.parametrize(
    ("cluster", "reason"),
    [(None, "ClusterNotFound"), ({"metadata": {"name": "db"}, "spec": {}}, "BackupNotConfigured"),
     ({"metadata": {"name": "db", "deletionTimestamp": STAMP}, "spec": CLUSTER["spec"]}, "ClusterDeleted")],
)  # fmt: skip
def test_backups_that_cannot_run_fail_with_a_reason(cluster: Any, reason: str) -> None:
    step = before_start({}, cluster=cluster, placement=None, now_stamp=STAMP)
    assert step.kind == "fail" and step.reason == reason
    assert step.status["phase"] == "Failed" and step.status["error"].startswith(reason + ": ")
    assert reason_of(step.status["error"]) == reason


def test_no_ready_instance_keeps_it_pending_and_finished_ones_are_left_alone() -> None:
    step = before_start({}, cluster=CLUSTER, placement=None, now_stamp=STAMP)
    assert (step.kind, step.status["phase"], step.requeue) == ("wait", "Pending", 15.0)
    for phase in ("Completed", "Failed"):
        assert before_start({"phase": phase}, cluster=None, placement=None, now_stamp=STAMP).kind == "done"
    running = before_start({"phase": "Running", "instance": "db-1"}, cluster=CLUSTER, placement=None,
                           now_stamp=STAMP)  # fmt: skip
    assert (running.kind, running.pod) == ("poll", "db-1")


def test_after_poll() -> None:
    assert after_poll(JobState("running"), now_stamp=STAMP).kind == "wait"
    assert after_poll(JobState("absent"), now_stamp=STAMP).kind == "start"
    assert after_poll(JobState("exited", 0), now_stamp=STAMP).kind == "collect"
    lost = after_poll(JobState("lost"), now_stamp=STAMP)
    assert (lost.kind, lost.reason) == ("fail", "BackupInterrupted")
    output = (
        "2026-12-01 08:00:01,000 [77] ERROR: Barman cloud backup exception: An error occurred "
        "(InvalidAccessKeyId) when calling the PutObject operation: key AKIA-SECRET is unknown"
    )
    failed = after_poll(JobState("exited", 1, output), now_stamp=STAMP, secrets=("AKIA-SECRET",))
    assert (failed.kind, failed.reason, failed.status["phase"]) == ("fail", "InvalidCredentials", "Failed")
    assert "AKIA-SECRET" not in failed.status["error"] and "<redacted>" in failed.status["error"]


# --- schedules ------------------------------------------------------------------------------------


def scheduled(**spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    return {"metadata": {"name": "nightly", "namespace": "shop", "uid": "u1",
                         "creationTimestamp": "2026-12-01T08:00:10Z"},
            "spec": {"cluster": "db", "schedule": "*/5 * * * *", **spec}, "status": status}  # fmt: skip


def test_immediate_first_run_is_named_after_the_creation_time() -> None:
    first = schedule_pass(scheduled(immediate=True), T0 + dt.timedelta(seconds=20))
    assert first.backup is not None
    assert first.backup["metadata"]["name"] == "nightly-20261201080010"
    assert first.backup["metadata"]["labels"] == {"db.example.com/cluster": "db",
                                                  "db.example.com/scheduled-backup": "nightly"}  # fmt: skip
    assert first.backup["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert first.backup["spec"] == {"cluster": "db"}
    assert first.status["lastScheduleTime"] == "2026-12-01T08:00:10Z"
    assert first.status["nextScheduleTime"] == "2026-12-01T08:05:00Z"
    # The same pass again (its status write lost) names the same Backup: created once.
    assert schedule_pass(scheduled(immediate=True), T0 + dt.timedelta(seconds=40)).backup == first.backup
    again = schedule_pass(scheduled(immediate=True, status=first.status), T0 + dt.timedelta(minutes=1))
    assert again.backup is None and again.requeue == 240.0


def test_scheduled_runs_and_suspend() -> None:
    assert schedule_pass(scheduled(), T0 + dt.timedelta(seconds=30)).backup is None
    due = schedule_pass(scheduled(), T0 + dt.timedelta(minutes=5, seconds=3))
    assert due.backup is not None and due.backup["metadata"]["name"] == "nightly-20261201080500"
    late = schedule_pass(scheduled(), T0 + dt.timedelta(minutes=17))  # missed runs collapse into one
    assert late.backup is not None and late.backup["metadata"]["name"] == "nightly-20261201081500"
    assert schedule_pass(scheduled(suspend=True), T0 + dt.timedelta(minutes=17)).backup is None


def test_backup_names_stay_valid_for_long_schedule_names() -> None:
    name = backup_name("x" * 260, T0)
    assert len(name) == 253 and name.endswith("-20261201080000")


# --- archiving ------------------------------------------------------------------------------------

OK_LINE = "42|000000010000000000000009|2026-12-01T07:59:00Z|0|||0"
FAILING_LINE = (
    "42|000000010000000000000009|2026-12-01T07:50:00Z|7|00000001000000000000000A|2026-12-01T07:59:50Z|3"
)


def test_healthy_archiving() -> None:
    stats = parse_archiver_line(OK_LINE)
    cond = archiving_condition(stats, primary="db-0")
    assert (cond.status, cond.reason) == ("True", "Archiving")
    # No moving figure in the message: a healthy primary's every segment rewrites no status.
    assert cond.message == "WAL archiving works on db-0"
    assert archiving_summary(stats, "db-0") == {
        "primary": "db-0",
        "lastArchivedWAL": "000000010000000000000009",
        "lastArchivedTime": "2026-12-01T07:59:00Z",
        "pendingWAL": 0,
    }


def test_failing_archiving_says_wal_piles_up_with_the_store_reason() -> None:
    stats = parse_archiver_line(FAILING_LINE)
    assert stats.failing and stats.pending == 3
    plain = archiving_condition(stats, primary="db-0")
    assert (plain.status, plain.reason) == ("False", "ArchiveCommandFailing")
    assert "piling up: 3 segment(s)" in plain.message
    failure = classify(1, "ERROR: An error occurred (NoSuchBucket) when calling the ListObjectsV2 operation")
    cond = archiving_condition(stats, store_failure=failure, primary="db-0")
    assert (cond.status, cond.reason) == ("False", "BucketNotFound")
    assert archiving_summary(stats, "db-0")["lastFailedWAL"] == "00000001000000000000000A"


def test_archiving_unknown_and_not_yet() -> None:
    assert archiving_condition(None).as_tuple()[:2] == ("Unknown", "NoPrimary")
    assert archiving_condition(None, primary="db-0").as_tuple()[:2] == ("Unknown", "ArchiverUnreadable")
    assert archiving_condition(parse_archiver_line("0|||0|||1")).as_tuple()[:2] == (
        "False",
        "NothingArchivedYet",
    )
    refused = classify(1, "ERROR: An error occurred (SignatureDoesNotMatch) when calling ListObjectsV2")
    early = archiving_condition(parse_archiver_line("0|||0|||0"), store_failure=refused, primary="db-0")
    assert early.as_tuple()[:2] == ("False", "InvalidCredentials")
    assert "no WAL segment archived" in early.message
    with pytest.raises(ValueError, match="7 fields"):
        parse_archiver_line("1|2")


def test_last_backup_condition_follows_the_newest_finished_backup() -> None:
    def b(name: str, phase: str, stopped: str, **extra: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"phase": phase, "stoppedAt": stopped, **extra}}

    assert last_backup_condition([b("a", "Running", "")]) is None
    ok = [b("a", "Failed", "2026-12-01T01:00:00Z", error="BucketNotFound: no"),
          b("b", "Completed", "2026-12-01T02:00:00Z", backupID="20261201T015900")]  # fmt: skip
    assert last_backup_condition(ok)[:2] == ("True", "BackupCompleted")  # type: ignore[index]
    bad = [*ok, b("c", "Failed", "2026-12-01T03:00:00Z", error="InvalidCredentials: refused")]
    assert last_backup_condition(bad)[:2] == ("False", "InvalidCredentials")  # type: ignore[index]


# --- finalizer ------------------------------------------------------------------------------------


def cluster(on_delete: str | None = "delete", *, finalizer: bool = False, deleting: bool = False,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "db", "finalizers": [FINALIZER] if finalizer else [],
                            "annotations": annotations or {}}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T08:00:00Z"
    spec = {"backup": {"onDelete": on_delete}} if on_delete else {}
    return {"metadata": meta, "spec": spec}


def decide(c: dict[str, Any], sts: bool = False, pods: int = 0, now: dt.datetime = T0) -> str:
    return decide_finalizer(c, statefulset_exists=sts, pods_left=pods, now=now).action


def test_finalizer_is_added_only_for_delete_and_removed_when_the_policy_changes() -> None:
    assert decide(cluster("delete")) == "add"
    assert decide(cluster("delete", finalizer=True)) == "none"
    assert decide(cluster("keep")) == "none"
    assert decide(cluster(None)) == "none"
    assert decide(cluster("keep", finalizer=True)) == "remove"


def test_deletion_stops_the_instances_then_deletes_the_store() -> None:
    going = cluster("delete", finalizer=True, deleting=True)
    assert decide(going, sts=True, pods=2) == "stop-pods"
    assert decide(going, pods=2) == "wait-pods"
    assert decide(going, pods=2, now=T0 + dt.timedelta(minutes=4)) == "delete-store"  # a lost node
    assert decide(going) == "delete-store"
    assert decide(cluster("keep", finalizer=True, deleting=True)) == "remove"
    assert decide(cluster("delete", deleting=True)) == "none"
    released = cluster("delete", finalizer=True, deleting=True, annotations={RELEASE_ANNOTATION: "true"})
    assert decide(released, sts=True, pods=2) == "release-by-hand"


# --- conditions merge and exec status ---------------------------------------------------------------


def test_merged_conditions_keep_others_and_transition_times() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "r", "message": "", "observedGeneration": 1,
             "lastTransitionTime": "2026-12-01T07:00:00Z"}  # fmt: skip
    first = merged_conditions({"conditions": [ready]}, {"ContinuousArchiving": ("False", "X", "m")},
                              generation=3, stamp="2026-12-01T08:00:00Z")  # fmt: skip
    assert first[0] == ready and first[1]["lastTransitionTime"] == "2026-12-01T08:00:00Z"
    same = merged_conditions({"conditions": first}, {"ContinuousArchiving": ("False", "Y", "m2")},
                             generation=3, stamp="2026-12-01T09:00:00Z")  # fmt: skip
    assert same[1]["lastTransitionTime"] == "2026-12-01T08:00:00Z" and same[1]["reason"] == "Y"
    kept = merged_conditions({"conditions": same}, {"LastBackupSucceeded": ("True", "B", "")},
                             generation=3, stamp="2026-12-01T09:00:00Z")  # fmt: skip
    assert [c["type"] for c in kept] == ["Ready", "ContinuousArchiving", "LastBackupSucceeded"]
    gone: dict[str, tuple[str, str, str] | None] = {"ContinuousArchiving": None, "LastBackupSucceeded": None}
    removed = merged_conditions({"conditions": kept}, gone, generation=3, stamp="2026-12-01T09:00:00Z")
    assert removed == [ready]


def test_exec_status_and_url() -> None:
    assert exit_status_of({"status": "Success"}) == 0
    failure = {"status": "Failure", "reason": "NonZeroExitCode",
               "details": {"causes": [{"reason": "ExitCode", "message": "4"}]}}  # fmt: skip
    assert exit_status_of(failure) == 4
    with pytest.raises(ExecError, match="container not found"):
        exit_status_of({"status": "Failure", "message": "container not found"})
    url = exec_url("https://10.0.0.1:6443", "shop", "db-0", "postgres", ["sh", "-c", "echo a b"])
    assert url.startswith("wss://10.0.0.1:6443/api/v1/namespaces/shop/pods/db-0/exec?container=postgres")
    assert "command=sh&command=-c&command=echo+a+b" in url
