"""`kubectl pgc switchover`/`restart`: checks before a request is written, and the operator's names."""

from __future__ import annotations

import pytest

from pg_operator.cli.pgc.errors import NOT_FOUND, NOT_READY, PgcError
from pg_operator.cli.pgc.requests import SWITCHOVER_ANNOTATION, latest_event, switchover_target
from pg_operator.controller.reconcilers import high_availability

STATUS = {
    "currentPrimary": "db-0",
    "instances": [{"name": "db-0", "role": "primary"}, {"name": "db-1", "role": "replica"}],
}


def test_the_plugin_writes_the_annotation_the_reconciler_reads() -> None:
    assert SWITCHOVER_ANNOTATION == high_availability.SWITCHOVER_ANNOTATION


def test_a_replica_or_auto_is_worth_asking_for() -> None:
    assert switchover_target(STATUS, "db-1") is None
    assert switchover_target(STATUS, "auto") is None


def test_the_primary_itself_needs_nothing() -> None:
    assert switchover_target(STATUS, "db-0") == "db-0 is the primary already"


def test_an_unknown_instance_is_refused_listing_the_instances() -> None:
    with pytest.raises(PgcError) as err:
        switchover_target(STATUS, "db-7")
    assert err.value.code == NOT_FOUND and "db-0, db-1" in str(err.value)


def test_auto_without_a_replica_has_nothing_to_act_on() -> None:
    with pytest.raises(PgcError) as err:
        switchover_target(
            {"currentPrimary": "db-0", "instances": [{"name": "db-0", "role": "primary"}]}, "auto"
        )
    assert err.value.code == NOT_READY


def test_the_newest_event_of_a_reason_wins() -> None:
    events = [
        {"reason": "SwitchoverRefused", "message": "old", "lastTimestamp": "2026-12-02T10:00:00Z"},
        {"reason": "Switchover", "message": "other", "lastTimestamp": "2026-12-02T12:00:00Z"},
        {"reason": "SwitchoverRefused", "message": "new", "eventTime": "2026-12-02T11:00:00.000000Z"},
    ]
    found = latest_event(events, ("SwitchoverRefused",))
    assert found is not None and found["message"] == "new"
    assert latest_event(events, ("Nothing",)) is None
