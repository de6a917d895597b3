"""`pg-operator` argument parsing: defaults, repeatable namespaces, refused values."""

from __future__ import annotations

import pytest

from pg_operator.cli.main import build_parser


def test_run_defaults_to_cluster_wide_with_health_and_metrics_ports() -> None:
    args = build_parser().parse_args(["run"])
    assert args.namespaces == []
    assert (args.health_port, args.metrics_port) == (8080, 8081)
    assert args.log_format == "text"
    assert args.lease_duration == 15


def test_namespace_is_repeatable() -> None:
    args = build_parser().parse_args(["run", "--namespace", "a", "-n", "b", "--log-format", "json"])
    assert args.namespaces == ["a", "b"]
    assert args.log_format == "json"


@pytest.mark.parametrize("argv", [["run", "--health-port", "0"], ["run", "--log-format", "xml"], []])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


def test_manifests_check_flag() -> None:
    assert build_parser().parse_args(["manifests", "--check"]).check is True
