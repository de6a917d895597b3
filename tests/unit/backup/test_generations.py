"""Generations of a cluster's backups (backup/generations.py), with plain values."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from pg_operator.backup import generations as g

T0 = dt.datetime(2026, 12, 2, 22, 0, tzinfo=dt.UTC)


def test_first_generation_keeps_the_cluster_name_later_ones_name_their_major() -> None:
    assert g.server_name("orders-db", "16", "16") == "orders-db"
    assert g.server_name("orders-db", "17", "16") == "orders-db-pg17"
    longest = "a" * 50  # the CRD's longest cluster name: still a DNS label
    assert len(g.server_name(longest, "18", "15")) <= 63


def test_started_appends_once_and_parse_reads_back_what_dump_wrote() -> None:
    gens = g.started([], "orders-db", "16", "17", T0)
    assert gens == [
        g.Generation("orders-db", "16"),
        g.Generation("orders-db-pg17", "17", "2026-12-02T22:00:00.000000Z"),
    ]
    assert g.started(gens, "orders-db", "16", "17", T0 + dt.timedelta(hours=1)) == gens
    assert g.parse(g.dump(gens)) == gens
    later = g.started(gens, "orders-db", "17", "18", T0 + dt.timedelta(days=30))
    assert [x.server_name for x in later] == ["orders-db", "orders-db-pg17", "orders-db-pg18"]
    # The store's document reads back too.
    assert g.parse(g.store_document("orders-db", later), "store") == later


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not JSON"),
        ('{"x": 1}', "expected a list"),
        ('[{"serverName": "Orders", "major": "16"}]', "[0].serverName"),
        ('[{"serverName": "orders-db", "major": "sixteen"}]', "[0].major"),
        ('[{"serverName": "a", "major": "16"}, {"serverName": "a-pg17", "major": "17"}]', "[1].since"),
        ('[{"serverName": "a", "major": "16", "since": "yesterday"}]', "[0].since"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(raw: str, message: str) -> None:
    pattern = message.replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ValueError, match=f"^{g.ANNOTATION}.*{pattern}"):
        g.parse(raw)


def test_no_record_is_one_generation_under_the_cluster_name() -> None:
    assert g.parse(None) == [] and g.parse("") == []
    assert g.known([], "orders-db", "16") == [g.Generation("orders-db", "16")]
    assert g.known([], "orders-db", None) == []
    assert g.for_major([], "orders-db", "16") == "orders-db"


def test_for_major_follows_the_record_and_the_rule_before_the_record_is_seen() -> None:
    gens = g.started([], "orders-db", "16", "17", T0)
    assert g.for_major(gens, "orders-db", "16") == "orders-db"
    assert g.for_major(gens, "orders-db", "17") == "orders-db-pg17"
    only_first = gens[:1]
    assert g.for_major(only_first, "orders-db", "17") == "orders-db-pg17"


def test_a_target_before_the_switch_reads_the_old_generation_latest_the_newest() -> None:
    gens = g.started([], "orders-db", "16", "17", T0)
    assert g.for_target(gens, None).major == "17"
    assert g.for_target(gens, "2026-12-02T21:59:59Z").major == "16"
    assert g.for_target(gens, "2026-12-02T22:59:59+01:00").major == "16"  # 21:59:59 UTC
    assert g.for_target(gens, "2026-12-02T22:00:00Z").major == "17"
    assert g.for_target(gens, "2027-01-01T00:00:00Z").major == "17"
    with pytest.raises(ValueError, match="no generations"):
        g.for_target([], None)


def test_a_restore_into_another_major_is_refused_with_the_major_to_use() -> None:
    old = g.Generation("orders-db", "16")
    assert g.major_mismatch(old, "16", "orders-db") is None
    why = g.major_mismatch(old, "17", "orders-db")
    assert why is not None and "spec.version is 17" in why and "version '16'" in why


def test_retention_empties_an_old_generation_only_when_later_ones_keep_the_promise() -> None:
    gens = g.started([], "c", "16", "17", T0)
    day = dt.timedelta(days=1)
    now = T0 + 10 * day
    # keepLast 2: one backup on 17 is not enough, two are.
    assert g.retired(gens, [[T0 - day], [T0 + day]], keep_last=2, window=None, now=now) == []
    assert (
        g.retired(gens, [[T0 - day], [T0 + day, T0 + 2 * day]], keep_last=2, window=None, now=now) == gens[:1]
    )
    # A 7-day window starts at T0+3d: 17's first backup (T0+1d) ended before it → 16 is not needed.
    assert g.retired(gens, [[T0 - day], [T0 + day]], keep_last=None, window=7 * day, now=now) == gens[:1]
    # ... but with a 9-day window (starting T0+1h) the first 17 backup ended inside it: keep 16.
    assert g.retired(gens, [[T0 - day], [T0 + 2 * day]], keep_last=None, window=9 * day, now=now) == []
    # No completed backup on 17 yet: never.
    assert g.retired(gens, [[T0 - day], []], keep_last=None, window=day, now=now) == []
    # The current generation is never retired here.
    assert g.retired(gens[:1], [[T0]], keep_last=1, window=None, now=now) == []


def test_store_document_names_the_cluster() -> None:
    doc = json.loads(g.store_document("orders-db", g.first("orders-db", "16")))
    assert doc["cluster"] == "orders-db"
    assert doc["generations"] == [{"serverName": "orders-db", "major": "16"}]
    assert g.store_key("prod/orders-db/") == "prod/orders-db/pg-operator-generations.json"


def test_the_cluster_object_names_its_current_generation() -> None:
    gens = g.started([], "orders-db", "16", "17", T0)
    body = {"metadata": {"name": "orders-db", "annotations": {g.ANNOTATION: g.dump(gens)}}}
    assert g.current_server(body) == "orders-db-pg17"
    assert g.current_server({"metadata": {"name": "orders-db"}}) == "orders-db"
    broken = {"metadata": {"name": "orders-db", "annotations": {g.ANNOTATION: "{"}}}
    assert g.current_server(broken) == "orders-db"
    chosen = {"metadata": {"annotations": {g.RECOVERY_ANNOTATION: json.dumps(gens[0].to_mapping())}}}
    assert g.recovery_generation(chosen) == gens[0]
    assert g.recovery_generation({"metadata": {}}) is None


def test_a_backup_id_places_a_restore_by_its_start_time() -> None:
    assert g.target_time_of("2026-12-02T21:00:00Z", "20261202T230000") == "2026-12-02T21:00:00Z"
    assert g.target_time_of(None, "20261202T230000") == "2026-12-02T23:00:00Z"
    assert g.target_time_of(None, None) is None


def test_the_new_generation_is_not_restorable_until_its_base_backup_completed() -> None:
    gens = g.started([], "orders-db", "16", "17", T0)
    backup = g.base_backup_object("shop", "orders-db", "uid-1", gens[-1])
    assert backup["metadata"]["name"] == "orders-db-pg17-base"
    assert backup["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert backup["spec"] == {"cluster": "orders-db"}
    old_done = {"status": {"phase": "Completed", "serverName": "orders-db"}}
    running = {"status": {"phase": "Running", "serverName": "orders-db-pg17"}}
    gap = g.backup_gap(gens, [old_done, running])
    assert gap is not None and gap[:2] == ("False", "NewGenerationNotBackedUp")
    assert "not possible until one completes" in gap[2] and "PostgreSQL 16 from server orders-db" in gap[2]
    done = {"status": {"phase": "Completed", "serverName": "orders-db-pg17"}}
    assert g.backup_gap(gens, [old_done, done]) is None
    assert g.backup_gap(gens[:1], []) is None


def test_a_new_generations_base_backup_runs_on_the_primary() -> None:
    when = dt.datetime(2026, 12, 2, 22, 0, tzinfo=dt.UTC)
    [_, new] = g.started([], "orders-db", "16", "17", when)
    backup = g.base_backup_object("shop", "orders-db", "u1", new)
    assert g.taken_on_primary(backup)
    assert not g.taken_on_primary({"metadata": {"name": "nightly"}, "spec": {"cluster": "orders-db"}})


def test_every_backup_runs_on_the_primary_for_a_while_after_an_upgrade() -> None:
    gens = [g.Generation("orders-db", "16"), g.Generation("orders-db-pg17", "17", "2026-12-03T07:00:00Z")]
    body = {"metadata": {"name": "orders-db", "annotations": {g.ANNOTATION: g.dump(gens)}}}
    at = dt.datetime(2026, 12, 3, 7, 0, tzinfo=dt.UTC)
    assert g.just_upgraded(body, at + dt.timedelta(minutes=29))
    assert not g.just_upgraded(body, at + g.PRIMARY_AFTER_UPGRADE)
    one = {"metadata": {"name": "orders-db", "annotations": {g.ANNOTATION: g.dump(gens[:1])}}}
    assert not g.just_upgraded(one, at) and not g.just_upgraded(None, at)
