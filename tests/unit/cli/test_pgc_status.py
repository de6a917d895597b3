"""`kubectl pgc status`: the summary and the screen from plain dicts (a cluster's status and pods)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pg_operator.backup.archive_report import ARCHIVE_REPORT_ANNOTATION
from pg_operator.cli.pgc.status import human_age, human_bytes, render, summarize

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def pod(name: str, role: str, *, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"role": role}, "creationTimestamp": "2026-12-02T10:00:00Z"},
        "spec": {"nodeName": "node-1"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "postgres", "restartCount": restarts}],
        },
    }


def cluster(**status: Any) -> dict[str, Any]:
    base = {
        "phase": "Healthy",
        "currentPrimary": "db-0",
        "readyReplicas": 2,
        "observedGeneration": 3,
        "instances": [
            {"name": "db-0", "role": "primary", "ready": True, "timeline": 2},
            {
                "name": "db-1",
                "role": "replica",
                "ready": True,
                "timeline": 2,
                "lagBytes": 3 * 1024 * 1024,
                "pendingRestart": ["shared_buffers"],
            },
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllInstancesReady",
                "message": "2 of 2 ready",
                "lastTransitionTime": "2026-12-02T11:58:00Z",
            },
        ],
    }
    return {
        "metadata": {"name": "db", "namespace": "shop", "generation": 3, "annotations": {}},
        "spec": {"replicas": 2, "version": "16"},
        "status": {**base, **status},
    }


def test_summary_joins_the_operators_status_with_the_pods() -> None:
    s = summarize(cluster(), [pod("db-0", "primary"), pod("db-1", "replica", restarts=2)], NOW)
    assert s["ready"] is True and s["primary"] == "db-0" and not s["stale"]
    replica = s["instances"][1]
    assert replica == {
        "name": "db-1",
        "role": "replica",
        "ready": True,
        "timeline": 2,
        "lagBytes": 3 * 1024 * 1024,
        "pendingRestart": ["shared_buffers"],
        "node": "node-1",
        "restarts": 2,
        "ageSeconds": 7200,
        "podExists": True,
    }
    assert s["conditions"][0]["ageSeconds"] == 120
    assert s["archiving"] is None and s["lastBackup"] is None and s["requests"] == {}


def test_an_instance_without_a_pod_and_a_pod_not_yet_in_the_status_both_show() -> None:
    s = summarize(cluster(), [pod("db-1", "replica"), pod("db-2", "replica", ready=False)], NOW)
    by_name = {i["name"]: i for i in s["instances"]}
    assert by_name["db-0"]["podExists"] is False and by_name["db-0"]["restarts"] is None
    assert by_name["db-2"]["ready"] is False and by_name["db-2"]["role"] == "replica"


def test_archiving_backup_and_open_requests_with_their_ages() -> None:
    body = cluster(
        backup={
            "archiving": {
                "lastArchivedWAL": "000000020000000000000007",
                "lastArchivedTime": "2026-12-02T11:59:18Z",
                "pendingWAL": 1,
                "lastFailedWAL": "000000020000000000000005",
                "lastFailedTime": "2026-12-02T09:00:00Z",
            },
            "lastSuccessfulBackup": "db-nightly",
            "lastSuccessfulBackupTime": "2026-12-01T12:00:00Z",
        }
    )
    body["metadata"]["annotations"] = {
        "db.example.com/switchover-to": "db-1",
        "db.example.com/restart-requested": "2026-12-02T11:59:00Z",
    }
    s = summarize(body, [pod("db-0", "primary"), pod("db-1", "replica")], NOW)
    assert s["archiving"]["lastArchivedAgeSeconds"] == 42 and s["archiving"]["lastFailedAgeSeconds"] == 10800
    assert s["lastBackup"] == {"name": "db-nightly", "ageSeconds": 86400}
    assert s["requests"] == {"switchoverTo": "db-1", "restartRequested": "2026-12-02T11:59:00Z"}
    screen = render(s)
    assert "last 000000020000000000000007 42s ago   pending 1" in screen
    assert "last failure 000000020000000000000005 3h0m ago" in screen
    assert "Backup     db-nightly 1d0h ago" in screen
    assert "switchover to db-1 requested" in screen and "rolling restart requested" in screen


def test_the_primarys_live_report_wins_over_the_status() -> None:
    body = cluster(backup={"archiving": {"primary": "db-0", "lastArchivedWAL": "000000020000000000000007",
                                         "lastArchivedTime": "2026-12-01T11:00:00Z", "pendingWAL": 0,
                                         "lastFailedWAL": "000000020000000000000005",
                                         "lastFailedTime": "2026-12-01T10:59:00Z"}})  # fmt: skip
    primary = pod("db-0", "primary")
    primary["metadata"]["annotations"] = {ARCHIVE_REPORT_ANNOTATION: json.dumps({
        "gate": "archive 0123", "archivedCount": 90, "lastArchivedWAL": "000000020000000000000030",
        "lastArchivedTime": "2026-12-02T11:59:00Z"})}  # fmt: skip
    s = summarize(body, [primary, pod("db-1", "replica")], NOW)
    assert s["archiving"]["lastArchivedWAL"] == "000000020000000000000030"
    assert s["archiving"]["lastArchivedAgeSeconds"] == 60 and s["archiving"]["lastFailedWAL"] is None


def test_screen_lists_instances_and_conditions_in_columns() -> None:
    screen = render(summarize(cluster(), [pod("db-0", "primary"), pod("db-1", "replica")], NOW))
    lines = screen.splitlines()
    assert lines[0] == "Cluster    shop/db   PostgreSQL 16   Healthy"
    assert lines[1] == "Primary    db-0   ready 2/2"
    assert "Archiving  not configured (no spec.backup)" in lines
    header = next(line for line in lines if line.startswith("INSTANCE"))
    replica = next(line for line in lines if line.startswith("db-1"))
    assert replica.split() == ["db-1", "replica", "yes", "2", "3MiB", "shared_buffers", "node-1", "0", "2h0m"]
    assert header.index("LAG") == replica.index("3MiB")  # aligned
    assert any(line.split()[:3] == ["Ready", "True", "AllInstancesReady"] for line in lines)


def test_a_status_for_an_older_generation_and_no_primary_are_said() -> None:
    body = cluster(currentPrimary="", observedGeneration=2, phase="Failing over")
    s = summarize(body, [], NOW)
    assert s["stale"] is True
    screen = render(s)
    assert "(status not yet for the latest spec)" in screen and "Primary    NONE" in screen


def test_not_ready_when_the_condition_says_so() -> None:
    body = cluster(
        conditions=[
            {
                "type": "Ready",
                "status": "False",
                "reason": "InstancesNotReady",
                "message": "1 of 2 ready",
                "lastTransitionTime": "2026-12-02T11:59:00Z",
            }
        ]
    )
    assert summarize(body, [], NOW)["ready"] is False
    assert summarize({"metadata": {"name": "new"}}, [], NOW)["ready"] is False  # no status yet


def test_ages_and_sizes_read_like_kubectl() -> None:
    assert [human_age(s) for s in (None, 5, 65, 599, 600, 3700, 90000)] == [
        "-",
        "5s",
        "1m5s",
        "9m59s",
        "10m",
        "1h1m",
        "1d1h",
    ]
    assert [human_bytes(b) for b in (None, 0, 2048, 5 * 1024**3)] == ["-", "0B", "2KiB", "5GiB"]
