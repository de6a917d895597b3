"""spec.postgresql.parameters: settings that run commands, load code or name files are refused naming the
setting and why, values with control characters are refused naming the setting, ordinary settings are
kept; the CRD's rules are generated from the same list and give each refused name one message."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster
from pg_operator.api.crd import build
from pg_operator.api.parameters import (
    KEYS_ARE_UNENCRYPTED,
    LOADS_CODE,
    NAMES_A_FILE,
    OPERATOR_OWNED_PARAMETERS,
    OWNED_REASON,
    PARAMETER_RULES,
    REFUSED_PARAMETERS,
    REFUSED_SUFFIXES,
    RUNS_A_PROGRAM,
    WRITES_THE_LOG,
    refusal_reason,
)


def obj(parameters: dict[str, Any]) -> dict[str, Any]:
    spec = {"replicas": 1, "version": "16", "storage": "1Gi", "postgresql": {"parameters": parameters}}
    return {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u1"}, "spec": spec}


def refused(parameters: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(obj(parameters))
    return str(info.value)


def kept(parameters: dict[str, str]) -> dict[str, str]:
    return dict(PostgresCluster.from_obj(obj(parameters)).spec.postgresql.parameters)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("ssl_passphrase_command", RUNS_A_PROGRAM),
        ("myext.reload_command", RUNS_A_PROGRAM),  # any name ending in _command
        ("session_preload_libraries", LOADS_CODE),
        ("local_preload_libraries", LOADS_CODE),
        ("oauth_validator_libraries", LOADS_CODE),
        ("dynamic_library_path", LOADS_CODE),
        ("jit_provider", LOADS_CODE),
        ("extension_control_path", LOADS_CODE),
        ("ssl_cert_file", NAMES_A_FILE),
        ("ssl_key_file", NAMES_A_FILE),
        ("ssl_ca_file", NAMES_A_FILE),
        ("ssl_crl_file", NAMES_A_FILE),
        ("ssl_crl_dir", NAMES_A_FILE),
        ("ssl_dh_params_file", NAMES_A_FILE),
        ("krb_server_keyfile", NAMES_A_FILE),
        ("include", NAMES_A_FILE),
        ("include_dir", NAMES_A_FILE),
        ("include_if_exists", NAMES_A_FILE),
        ("pgaudit.log_file", NAMES_A_FILE),  # any name ending in _file
        ("myext.spool_directory", NAMES_A_FILE),  # any name ending in _directory
        ("log_directory", WRITES_THE_LOG),
        ("log_filename", WRITES_THE_LOG),
        ("event_source", WRITES_THE_LOG),
        ("ssl_passphrase_command_supports_reload", KEYS_ARE_UNENCRYPTED),
    ],
)
def test_settings_that_run_load_or_name_files_are_refused_naming_them(name: str, reason: str) -> None:
    msg = refused({name: "x", "work_mem": "64MB"})
    assert msg == f"spec.postgresql.parameters: {name} {reason}"


@pytest.mark.parametrize(
    "name", ["data_directory", "config_file", "hba_file", "ident_file", "external_pid_file"]
)
def test_file_locations_the_operator_owns_say_so(name: str) -> None:
    assert refused({name: "/tmp/x"}) == f"spec.postgresql.parameters: {name} {OWNED_REASON}"


@pytest.mark.parametrize(("name", "value"), [("ssl", "off"), ("ssl_min_protocol_version", "TLSv1")])
def test_tls_cannot_be_turned_off_or_weakened(name: str, value: str) -> None:
    assert refused({name: value}) == f"spec.postgresql.parameters: {name} {OWNED_REASON}"


def test_the_reason_is_told_whatever_the_case_of_the_name() -> None:
    assert "Session_Preload_Libraries loads code into the server" in refused(
        {"Session_Preload_Libraries": "x"}
    )


def test_every_refused_name_of_the_list_is_refused() -> None:
    for name in REFUSED_PARAMETERS:
        assert f"spec.postgresql.parameters: {name} " in refused({name: "x"}), name


def test_several_refusals_are_told_together_in_name_order() -> None:
    msg = refused({"ssl_cert_file": "a", "archive_command": "b", "work_mem": "1MB\n"})
    assert msg == (
        f"spec.postgresql.parameters: archive_command {OWNED_REASON}; ssl_cert_file {NAMES_A_FILE}; "
        "work_mem must not contain control characters (newline, carriage return, tab, NUL, ...): a newline "
        "would start another setting in postgresql.conf"
    )


@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\t", "\x1b", "\x7f"])
def test_control_characters_in_a_value_are_refused_naming_the_setting(char: str) -> None:
    msg = refused({"work_mem": f"4MB{char}x = 1", "shared_buffers": "128MB"})
    assert msg.startswith("spec.postgresql.parameters: work_mem must not contain control characters")
    assert "shared_buffers" not in msg


def test_a_name_with_a_trailing_newline_is_not_a_setting_name() -> None:
    assert "'work_mem\\n' is not a PostgreSQL setting name" in refused({"work_mem\n": "1MB"})


def test_ordinary_settings_stay_admitted() -> None:
    params = {
        "log_min_duration_statement": "250ms",
        "log_line_prefix": "%m [%p] %q%u@%d ",
        "log_statement": "ddl",
        "log_destination": "stderr",
        "log_file_mode": "0600",  # a permission, not a place
        "logging_collector": "off",
        "ssl_ciphers": "HIGH:MEDIUM:+3DES:!aNULL",  # TLS settings that name no file
        "ssl_max_protocol_version": "TLSv1.3",
        "search_path": '"$user", public',
        "shared_buffers": "256MB",
        "auto_explain.log_min_duration": "1s",
        "application_name": "café ünïcode",  # non-ASCII is not a control character
    }
    assert kept(params) == params


def test_the_brief_list_is_covered() -> None:
    # The settings issue 12 names, each refused one way or the other (shared_preload_libraries is admitted
    # from an allow-list since: test_preload_libraries.py).
    for name in (
        "ssl_passphrase_command",
        "session_preload_libraries",
        "local_preload_libraries",
        "dynamic_library_path",
        "jit_provider",
        "ssl_cert_file",
        "ssl_key_file",
        "ssl_ca_file",
        "ssl_crl_file",
        "ssl_crl_dir",
        "ssl_dh_params_file",
        "ssl_passphrase_command_supports_reload",
        "include",
        "include_dir",
        "include_if_exists",
        "data_directory",
        "hba_file",
        "ident_file",
        "config_file",
        "external_pid_file",
        "log_directory",
        "log_filename",
        "event_source",
    ):
        assert refusal_reason(name) is not None, name


# --- the CRD's rules, read back ------------------------------------------------------------------------

_LOOKUP = re.compile(r"^!\('([a-z0-9_.]+)' in self\)$")
_SUFFIX = re.compile(r"^self\.all\(k, !k\.endsWith\('([a-z_]+)'\)(?: \|\| k in \[(.*)\])?\)$")


def _cel_refusals(name: str) -> list[str]:
    """The messages the CRD's rules would give for a map holding `name` alone (a reading of the rules'
    two generated shapes; the name rule is left out)."""
    messages = []
    for r in PARAMETER_RULES:
        if m := _LOOKUP.match(r["rule"]):
            if m.group(1) == name:
                messages.append(r["message"])
        elif m := _SUFFIX.match(r["rule"]):
            exempt = re.findall(r"'([^']*)'", m.group(2) or "")
            if name.endswith(m.group(1)) and name not in exempt:
                messages.append(r["message"])
    return messages


def test_the_crd_gives_each_refused_name_one_message_the_same_as_pydantic() -> None:
    for name in (*OPERATOR_OWNED_PARAMETERS, *REFUSED_PARAMETERS):
        assert _cel_refusals(name) == [f"postgresql.parameters: {name} {refusal_reason(name)}"], name


def test_the_crd_refuses_a_suffix_by_its_group() -> None:
    for suffix, reason in REFUSED_SUFFIXES:
        name = f"myext.some{suffix}"
        assert _cel_refusals(name) == [
            f"postgresql.parameters: a setting whose name ends in {suffix} {reason}"
        ]
        assert refusal_reason(name) == reason
    assert _cel_refusals("work_mem") == []


def test_the_generated_crd_carries_the_rules_and_the_value_rule() -> None:
    spec = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    params = spec["properties"]["postgresql"]["properties"]["parameters"]
    assert params["x-kubernetes-validations"] == list(PARAMETER_RULES)
    value_rules = params["additionalProperties"]["x-kubernetes-validations"]
    assert value_rules[0]["rule"] == r"!self.matches(r'[\x00-\x1f\x7f]')"
