"""`kubectl pgc` arguments: --help on every command, kubectl's connection flags before or after the
command, durations, psql's pass-through arguments, and where the kubeconfig comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from pg_operator.cli.pgc.connection import kubeconfig_file
from pg_operator.cli.pgc.main import build_parser, main, split_passed

COMMANDS = ("status", "switchover", "restart", "reload", "backup", "psql", "logs", "certs")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_the_exit_codes(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"kubectl pgc {command}" in out and "--namespace" in out and "--context" in out
    assert "exit codes: 0 done" in out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)


def test_connection_flags_before_or_after_the_command() -> None:
    before = build_parser().parse_args(
        ["-n", "shop", "--context", "prod", "--kubeconfig", "/k", "status", "db"]
    )
    after = build_parser().parse_args(
        ["status", "db", "-n", "shop", "--context", "prod", "--kubeconfig", "/k"]
    )
    for args in (before, after):
        assert (args.namespace, args.context, args.kubeconfig, args.cluster) == ("shop", "prod", "/k", "db")
    assert not hasattr(build_parser().parse_args(["status", "db"]), "namespace")  # the context's, later


def test_durations_and_bad_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["switchover", "db", "--wait", "--timeout", "3m", "--to", "db-1"])
    assert (args.timeout, args.to, args.wait) == (180.0, "db-1", True)
    assert build_parser().parse_args(["logs", "db", "--since", "90s", "--tail", "5"]).since == 90.0
    for argv in (
        ["backup", "db", "--timeout", "soon"],
        ["logs", "db", "--tail", "-1"],
        ["psql", "db", "--replica", "--instance", "db-0"],
        ["status", "db", "-o", "yaml"],
        ["status"],
    ):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2, argv
    assert "not a duration" in capsys.readouterr().err


def test_psql_arguments_after_the_separator_go_to_psql() -> None:
    ours, passed = split_passed(
        ["psql", "db", "--replica", "-d", "app", "--", "-AtX", "-c", "select 1", "--"]
    )
    args = build_parser().parse_args(ours)
    assert args.replica and args.dbname == "app"
    assert passed == ["-AtX", "-c", "select 1", "--"]
    assert split_passed(["status", "db"]) == (["status", "db"], [])


def test_arguments_after_the_separator_are_refused_for_other_commands() -> None:
    with pytest.raises(SystemExit) as done:
        main(["status", "db", "--", "-x"])
    assert done.value.code == 2


def test_kubeconfig_as_kubectl_finds_it(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    second.write_text("{}")
    assert kubeconfig_file("/explicit", {}) == Path("/explicit")
    assert kubeconfig_file(None, {"KUBECONFIG": f"{first}:{second}"}) == second  # the first that exists


def test_a_missing_kubeconfig_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["status", "db", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no such file" in err
