"""When a requested switchover is answered: the named instance leads, or (for `auto`, and for a name
whose answer was lost) another instance leads than the one that led when Patroni was asked."""

from __future__ import annotations

from pg_operator.orchestration.requested_switchover import AUTO, Asked, answered


def test_a_named_target_is_done_once_it_leads() -> None:
    assert answered("db-2", "db-2", None) == "db-2 is the primary"
    assert answered("db-2", "db-0", None) is None
    assert answered("db-2", None, Asked("db-2", "db-0")) is None  # no primary seen: not yet


def test_auto_is_done_once_another_instance_leads_than_when_it_was_asked() -> None:
    assert answered(AUTO, "db-0", None) is None  # never asked: ask
    asked = Asked(AUTO, "db-0")
    assert answered(AUTO, "db-0", asked) is None  # refused, or not yet: ask again, from db-0
    done = answered(AUTO, "db-1", asked)
    assert done is not None and "db-1 is the primary" in done and "db-0" in done


def test_a_record_of_another_request_answers_nothing() -> None:
    # The request changed (auto → db-2) after db-1 took over for the first: db-2 is still to come.
    assert answered("db-2", "db-1", Asked(AUTO, "db-0")) is None
