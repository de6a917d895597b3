"""PostgreSQL's verdict on parameter values: reading `postgres -C` output (the lines below are what
PostgreSQL 15/16 print for each class of value, with the log_line_prefix the instances use), keeping
refused values out of the PATCH, and reading the sent values back from pg_settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pg_operator.orchestration.parameter_check import (
    ACCEPTED_MARK,
    CHECK_ARGV,
    REFUSED_MARK,
    Applied,
    applied_message,
    check_input,
    new_values,
    parse_check_output,
    read_back,
    refusal_message,
    value_text,
    verify_query,
    without_refused,
)
from pg_operator.orchestration.patroni_settings import desired_dynamic_settings, dynamic_config_patch

PREFIX = "2026-12-02 09:37:25.648 GMT [12432] "


def accepted(name: str, setting: str) -> str:
    return f"{ACCEPTED_MARK} {name}\n{setting}\n"


def refused(name: str, *lines: str) -> str:
    return f"{REFUSED_MARK} {name}\n" + "".join(f"{PREFIX}{line}\n" for line in lines)


# What PostgreSQL says, one case per class of value.
REFUSALS = {
    "not a number": (
        "work_mem",
        ['FATAL:  invalid value for parameter "work_mem": "lots"'],
        'invalid value for parameter "work_mem": "lots"',
    ),
    "wrong unit": (
        "statement_timeout",
        [
            'FATAL:  invalid value for parameter "statement_timeout": "5 fortnights"',
            'HINT:  Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".',
        ],
        'invalid value for parameter "statement_timeout": "5 fortnights" (HINT: Valid units for '
        'this parameter are "us", "ms", "s", "min", "h", and "d".)',
    ),
    "out of range": (
        "max_connections",
        ['FATAL:  300000 is outside the valid range for parameter "max_connections" (1 .. 262143)'],
        '300000 is outside the valid range for parameter "max_connections" (1 .. 262143)',
    ),
    "real out of range": (
        "random_page_cost",
        ['FATAL:  -1 is outside the valid range for parameter "random_page_cost" (0 .. 1.79769e+308)'],
        '-1 is outside the valid range for parameter "random_page_cost" (0 .. 1.79769e+308)',
    ),
    "not in the enum": (
        "log_statement",
        [
            'FATAL:  invalid value for parameter "log_statement": "bogus"',
            "HINT:  Available values: none, ddl, mod, all.",
        ],
        'invalid value for parameter "log_statement": "bogus" (HINT: Available values: none, ddl, mod, all.)',
    ),
    "not a Boolean": (
        "enable_seqscan",
        ['FATAL:  parameter "enable_seqscan" requires a Boolean value'],
        'parameter "enable_seqscan" requires a Boolean value',
    ),
    "unknown name": (
        "work_mme",
        ['FATAL:  unrecognized configuration parameter "work_mme"'],
        'unrecognized configuration parameter "work_mme"',
    ),
    "not settable": (
        "server_version",
        ['FATAL:  parameter "server_version" cannot be changed'],
        'parameter "server_version" cannot be changed',
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_class_of_refusal_is_quoted_as_postgresql_says_it(case: str) -> None:
    name, lines, reason = REFUSALS[case]
    verdict = parse_check_output([name], refused(name, *lines))[name]
    assert (verdict.accepted, verdict.unknown, verdict.reason) == (False, False, reason)


def test_accepted_values_carry_the_setting_postgresql_parsed_them_to() -> None:
    # work_mem 1.5MB → 1536 (kB, rounded as PostgreSQL does), 5min → 300000 ms, yes → on, ALL → all.
    out = (
        accepted("work_mem", "1536")
        + accepted("statement_timeout", "300000")
        + accepted("enable_seqscan", "on")
        + accepted("log_statement", "all")
        + accepted("myext.x", "bar")
    )
    verdicts = parse_check_output(
        ["work_mem", "statement_timeout", "enable_seqscan", "log_statement", "myext.x"], out
    )
    assert {n: (v.accepted, v.setting) for n, v in verdicts.items()} == {
        "work_mem": (True, "1536"),
        "statement_timeout": (True, "300000"),
        "enable_seqscan": (True, "on"),
        "log_statement": (True, "all"),
        "myext.x": (True, "bar"),
    }


def test_mixed_output_gives_each_name_its_own_verdict() -> None:
    out = accepted("shared_buffers", "8192") + refused("work_mem", REFUSALS["not a number"][1][0])
    verdicts = parse_check_output(["shared_buffers", "work_mem"], out)
    assert verdicts["shared_buffers"].accepted
    assert not verdicts["work_mem"].accepted and "work_mem" in verdicts["work_mem"].reason


def test_a_check_that_did_not_run_is_unknown_not_refused() -> None:
    missing = parse_check_output(["work_mem"], "")["work_mem"]
    assert missing.unknown and not missing.accepted
    no_binary = parse_check_output(["work_mem"], f"{REFUSED_MARK} work_mem\nsh: 1: postgres: not found\n")
    assert no_binary["work_mem"].unknown
    assert "postgres: not found" in no_binary["work_mem"].reason


def test_values_go_on_stdin_one_line_each_never_in_the_command_line() -> None:
    values = {"work_mem": "8MB", "enable_seqscan": False, "random_page_cost": 1.5, "myext.x": "a=b"}
    assert check_input(values) == b"enable_seqscan=off\nmyext.x=a=b\nrandom_page_cost=1.5\nwork_mem=8MB\n"
    assert CHECK_ARGV[:2] == ["sh", "-c"] and "8MB" not in " ".join(CHECK_ARGV)
    assert value_text(True) == "on" and value_text(64) == "64"
    # A line break would start another setting: refused here too, whatever the API let through.
    with pytest.raises(ValueError, match="work_mem"):
        check_input({"work_mem": "4MB\nshared_preload_libraries=x"})
    with pytest.raises(ValueError, match="not a parameter name"):
        check_input({"work mem": "1"})


BOOTSTRAPPED: dict[str, Any] = {
    "ttl": 30,
    "loop_wait": 10,
    "retry_timeout": 10,
    "primary_start_timeout": 0,
    "synchronous_mode": False,
    "synchronous_mode_strict": False,
    "postgresql": {
        "use_pg_rewind": True,
        "parameters": {
            "wal_level": "replica",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_retrieve_retry_interval": "1s",
            "work_mem": "8MB",
        },
    },
}


def config_cm(value: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "db-config", "annotations": {"config": json.dumps(value)}}}


def desired(parameters: dict[str, str]) -> dict[str, Any]:
    return desired_dynamic_settings(
        parameters, 0, "preferred", {"ttl": 30, "loop_wait": 10, "retry_timeout": 10}
    )


def test_a_refused_value_is_left_out_and_the_valid_ones_of_the_same_edit_still_go() -> None:
    want = desired({"work_mem": "lots", "shared_buffers": "64MB", "work_mme": "1"})
    patch = dynamic_config_patch(config_cm(BOOTSTRAPPED), want)
    assert new_values(patch) == {"work_mem": "lots", "shared_buffers": "64MB", "work_mme": "1"}
    kept = without_refused(want, BOOTSTRAPPED, {"work_mem", "work_mme"})
    # work_mem stays as Patroni holds it (8MB), the unknown name is not added at all.
    assert dynamic_config_patch(config_cm(BOOTSTRAPPED), kept) == {
        "postgresql": {"parameters": {"shared_buffers": "64MB"}}
    }


def test_nothing_is_sent_when_the_only_change_is_refused() -> None:
    want = desired({"work_mem": "lots"})
    kept = without_refused(want, BOOTSTRAPPED, {"work_mem"})
    assert dynamic_config_patch(config_cm(BOOTSTRAPPED), kept) is None


def test_removals_need_no_check() -> None:
    patch = dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({}))
    assert patch == {"postgresql": {"parameters": {"work_mem": None}}}
    assert new_values(patch) == {}


def test_the_refusal_message_names_each_parameter_and_postgresqls_reason() -> None:
    message = refusal_message(
        {
            "work_mem": 'invalid value for parameter "work_mem": "lots"',
            "work_mme": 'unrecognized configuration parameter "work_mme"',
        }
    )
    assert message.startswith("spec.postgresql.parameters: PostgreSQL refuses work_mem, work_mme (")
    assert 'work_mem: invalid value for parameter "work_mem": "lots"' in message
    assert "keep their previous value" in message


def test_read_back_tells_applied_from_waiting_for_a_restart_from_not_in_effect() -> None:
    expected = {"work_mem": "8192", "shared_buffers": "8192", "statement_timeout": "300000"}
    psql = "shared_buffers|16384|t\nstatement_timeout|0|f\nwork_mem|8192|f\n"
    assert read_back(expected, psql) == Applied(
        applied=("work_mem",), waiting_restart=("shared_buffers",), not_yet=("statement_timeout",)
    )
    # A name pg_settings does not list (Patroni dropped it) is not in effect either.
    assert read_back({"myext.x": "1"}, "").not_yet == ("myext.x",)


def test_the_event_claims_only_what_the_primary_shows() -> None:
    message = applied_message(
        Applied(applied=("work_mem",), waiting_restart=("shared_buffers",), not_yet=("statement_timeout",)),
        "db-0",
        removed=["log_statement"],
    )
    assert "applied on primary db-0" in message and "parameter work_mem" in message
    assert "waiting for a restart of every instance: parameter shared_buffers" in message
    assert "not in effect on db-0: parameter statement_timeout" in message
    assert "removed from Patroni's configuration: parameter log_statement" in message
    applied_part = message.split(";")[0]
    assert "statement_timeout" not in applied_part and "shared_buffers" not in applied_part


def test_the_verify_query_only_takes_parameter_names() -> None:
    assert verify_query(["work_mem", "auto_explain.log_min_duration"]).endswith(
        "where name in ('auto_explain.log_min_duration', 'work_mem')"
    )
    with pytest.raises(ValueError, match="not a parameter name"):
        verify_query(["work_mem'); drop table x; --"])
