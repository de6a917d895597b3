"""Who owns a store prefix (backup.store_ownership) and the archive gate in front of archive_command
(backup.archive_gate), with plain dicts; the gate's shell line is run by a real sh with a stand-in tool."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pg_operator.backup.archive_gate import gate_line, gate_token, gated_archive_command, write_gate_script
from pg_operator.backup.barman import ObjectStore
from pg_operator.backup.store_ownership import (
    REASON_NOT_EMPTY,
    REASON_OWNED_ELSEWHERE,
    Owner,
    UnreadableMarker,
    adoption_evidence,
    decide,
    decide_deletion,
    marker_body,
    marker_key,
    owner_of,
    parse_marker,
)

STORE = ObjectStore(bucket="backups", server_name="dup", path="e2e", endpoint_url="http://s3:9000")
ME = Owner("team-b", "dup", "uid-b")
OTHER = Owner("team-a", "dup", "uid-a")
T0 = dt.datetime(2026, 12, 2, 9, 0, tzinfo=dt.UTC)


def cluster(**status: Any) -> dict[str, Any]:
    meta = {"name": "dup", "namespace": "team-b", "uid": "uid-b", "creationTimestamp": "2026-12-01T00:00:00Z"}
    return {"metadata": meta, "spec": {}, "status": status}


def backup(name: str, *, created: str = "2026-12-01T01:00:00Z", **status: Any) -> dict[str, Any]:
    st = {"phase": "Completed", "backupID": "20261201T010000", "serverName": "dup",
          "destinationPath": "s3://backups/e2e", **status}  # fmt: skip
    return {"metadata": {"name": name, "namespace": "team-b", "creationTimestamp": created},
            "spec": {"cluster": "dup"}, "status": st}  # fmt: skip


# --- the marker ------------------------------------------------------------------------------------------


def test_the_marker_names_namespace_name_and_uid_and_reads_back() -> None:
    assert marker_key(STORE) == "e2e/dup/pg-operator-owner.json"
    data = marker_body(ME, how="claimed", now=T0)
    doc = json.loads(data)
    assert doc["namespace"] == "team-b" and doc["name"] == "dup" and doc["uid"] == "uid-b"
    assert doc["how"] == "claimed" and doc["writtenAt"] == "2026-12-02T09:00:00Z"
    assert parse_marker(data) == ME
    assert owner_of(cluster()) == ME


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"kind": "Other"}', b"\xff",
                                  b'{"kind": "PostgresClusterStorePrefix", "name": "x"}'])  # fmt: skip
def test_a_marker_that_cannot_be_read_is_refused(data: bytes) -> None:
    with pytest.raises(UnreadableMarker):
        parse_marker(data)


# --- the verdict before archiving or a base backup -------------------------------------------------------


def test_an_empty_prefix_is_claimed_and_our_marker_is_ours() -> None:
    claim = decide(ME, STORE, marker=None, has_objects=False)
    assert claim.kind == "claim" and claim.ours
    owned = decide(ME, STORE, marker=ME, has_objects=True)
    assert owned.kind == "owned" and owned.ours


def test_another_clusters_marker_is_refused_naming_the_prefix_and_the_owner() -> None:
    v = decide(ME, STORE, marker=OTHER, has_objects=True)
    assert not v.ours and v.kind == "owned-elsewhere" and v.reason == REASON_OWNED_ELSEWHERE
    assert "s3://backups/e2e/dup/" in v.message and "team-a/dup (uid uid-a)" in v.message
    assert v.owner == OTHER


def test_an_earlier_cluster_of_the_same_name_is_named_as_such() -> None:
    earlier = Owner("team-b", "dup", "uid-old")
    v = decide(ME, STORE, marker=earlier, has_objects=True)
    assert not v.ours and "earlier cluster of the same name" in v.message and "uid-old" in v.message


def test_objects_without_a_marker_are_refused_unless_our_records_prove_them() -> None:
    v = decide(ME, STORE, marker=None, has_objects=True)
    assert not v.ours and v.reason == REASON_NOT_EMPTY and "s3://backups/e2e/dup/" in v.message
    adopted = decide(ME, STORE, marker=None, has_objects=True, proof="Backup nightly-1")
    assert adopted.kind == "adopt" and adopted.ours and "Backup nightly-1" in adopted.message


def test_an_unreadable_marker_is_refused_even_with_proof() -> None:
    v = decide(ME, STORE, marker=None, marker_problem="the marker is not JSON", has_objects=True, proof="x")
    assert not v.ours and v.reason == REASON_OWNED_ELSEWHERE and "not JSON" in v.message


# --- what proves a prefix is this cluster's (clusters that archived before markers) ---------------------


def test_evidence_from_a_completed_backup_of_this_cluster_into_this_store() -> None:
    ev = adoption_evidence(cluster(), [backup("nightly-1")], STORE)
    assert [(e.key_prefix, e.what) for e in ev] == [("e2e/dup/base/20261201T010000/", "Backup nightly-1")]


@pytest.mark.parametrize(
    "other",
    [
        backup("older", created="2026-11-30T00:00:00Z"),  # made for an earlier cluster of the name
        backup("elsewhere", destinationPath="s3://backups/other"),
        backup("renamed", serverName="dup-2"),
        backup("failed", phase="Failed"),
        {**backup("foreign"), "spec": {"cluster": "not-dup"}},
    ],
)  # fmt: skip
def test_backups_that_prove_nothing(other: dict[str, Any]) -> None:
    assert adoption_evidence(cluster(), [other], STORE) == []


def test_evidence_from_the_last_archived_segment_in_the_clusters_own_status() -> None:
    body = cluster(backup={"archiving": {"lastArchivedWAL": "000000010000000000000003"}})
    (ev,) = adoption_evidence(body, [], STORE)
    assert ev.key_prefix == "e2e/dup/wals/0000000100000000/000000010000000000000003"
    # A fresh status (a recreated cluster) or a name that is not a segment proves nothing.
    assert adoption_evidence(cluster(), [], STORE) == []
    odd = cluster(backup={"archiving": {"lastArchivedWAL": "00000002.history"}})
    assert adoption_evidence(odd, [], STORE) == []


# --- retention and the store finalizer: only a prefix whose marker is ours ------------------------------


def test_deletion_only_under_our_own_marker() -> None:
    assert decide_deletion(ME, STORE, marker=ME, marker_problem=None, has_objects=True).kind == "delete"
    assert decide_deletion(ME, STORE, marker=None, marker_problem=None, has_objects=False).kind == "nothing"
    for marker, problem, has in ((OTHER, None, True), (None, None, True), (None, "not JSON", True),
                                 (Owner("team-b", "dup", "uid-old"), None, True)):  # fmt: skip
        left = decide_deletion(ME, STORE, marker=marker, marker_problem=problem, has_objects=has)
        assert left.kind == "leave" and "s3://backups/e2e/dup/" in left.message, (marker, problem)


def test_retention_runs_only_on_a_verdict_that_is_ours() -> None:
    # The cluster pass opens the gate ("archive") and runs retention only for these verdicts.
    kinds = {v.kind: v.ours for v in (
        decide(ME, STORE, marker=ME, has_objects=True),
        decide(ME, STORE, marker=None, has_objects=False),
        decide(ME, STORE, marker=None, has_objects=True, proof="p"),
        decide(ME, STORE, marker=OTHER, has_objects=True),
        decide(ME, STORE, marker=None, has_objects=True),
    )}  # fmt: skip
    want = {"owned": True, "claim": True, "adopt": True, "owned-elsewhere": False, "not-empty": False}
    assert kinds == want


# --- the gate, run by sh ---------------------------------------------------------------------------------


def _tool(bin_dir: Path, log: Path) -> None:
    tool = bin_dir / "barman-cloud-wal-archive"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_the_gate_archives_discards_or_waits(tmp_path: Path) -> None:
    bin_dir, run_dir, log = tmp_path / "bin", tmp_path / "run", tmp_path / "calls"
    bin_dir.mkdir()
    run_dir.mkdir()
    _tool(bin_dir, log)
    store = ObjectStore(bucket="backups", server_name="dup", path="e2e", bin_dir=str(bin_dir))
    command = gated_archive_command(store, str(run_dir)).replace("%p", "pg_wal/000000010000000000000001")

    def archive() -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, check=False)

    closed = archive()  # no gate yet: PostgreSQL keeps the segment and retries
    assert closed.returncode == 1 and "waits until the operator" in closed.stderr and not log.exists()
    subprocess.run(["sh", "-c", write_gate_script("discard", store, str(run_dir))], check=True)
    assert archive().returncode == 0 and not log.exists()  # someone else's prefix: recycled, not uploaded
    subprocess.run(["sh", "-c", write_gate_script("archive", store, str(run_dir))], check=True)
    assert (run_dir / "pgop-archive-gate").read_text() == gate_line("archive", store) + "\n"
    assert archive().returncode == 0
    assert log.read_text().split()[-3:] == ["s3://backups/e2e", "dup", "pg_wal/000000010000000000000001"]
    # A gate written for another store opens nothing.
    moved = ObjectStore(bucket="backups", server_name="dup", path="e2e-2", bin_dir=str(bin_dir))
    assert gate_token(moved) != gate_token(store)
    subprocess.run(["sh", "-c", write_gate_script("archive", moved, str(run_dir))], check=True)
    assert archive().returncode == 1
