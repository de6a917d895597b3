"""`kubectl pgc logs`: lines of several instances merged by the kubelet's timestamps."""

from __future__ import annotations

from pg_operator.cli.pgc.logs import format_line, merge, split_timestamp


def test_timestamps_with_trimmed_fractions_sort_as_times() -> None:
    # The kubelet writes RFC 3339 with trailing zeros of the fraction dropped: .5 is after .123456789.
    a = split_timestamp("2026-12-02T12:00:00.5Z later")
    b = split_timestamp("2026-12-02T12:00:00.123456789Z earlier")
    assert a[0] > b[0]
    assert a[1:] == ("2026-12-02T12:00:00.5Z", "later")
    assert split_timestamp("2026-12-02T12:00:01Z whole second")[0] == ("2026-12-02T12:00:01", "000000000")


def test_a_line_without_a_timestamp_is_kept_whole() -> None:
    assert split_timestamp("plain text here") == (("", ""), "", "plain text here")


def test_instances_merge_by_time_and_keep_their_own_order_on_ties() -> None:
    merged = merge(
        {
            "db-0": ["2026-12-02T12:00:00.1Z a1\n", "2026-12-02T12:00:02Z a2", "2026-12-02T12:00:02Z a3"],
            "db-1": ["2026-12-02T12:00:01.999Z b1", "2026-12-02T12:00:02Z b2", "2026-12-02T12:00:03Z b3"],
        }
    )
    assert [(pod, text) for _, pod, _, text in merged] == [
        ("db-0", "a1"),
        ("db-1", "b1"),
        ("db-0", "a2"),
        ("db-0", "a3"),
        ("db-1", "b2"),
        ("db-1", "b3"),
    ]


def test_lines_carry_the_instance_and_the_timestamp_on_request() -> None:
    assert format_line("db-0", "2026-12-02T12:00:00Z", "ready", 5, False) == "db-0  | ready"
    assert format_line("db-10", "2026-12-02T12:00:00Z", "ready", 5, True) == (
        "2026-12-02T12:00:00Z db-10 | ready"
    )
