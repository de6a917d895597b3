"""shared_preload_libraries is admitted when every entry is on the operator's allow-list and refused naming
the entry otherwise; a library missing from a major's image is refused for that version; pgaudit's
settings are admitted with checked values, pgaudit.role as tenant input. The CRD carries the same rules."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster
from pg_operator.api.crd import build
from pg_operator.api.parameters import (
    LOADS_CODE,
    PARAMETER_RULES,
    PGAUDIT_SETTINGS,
    PRELOADABLE_LIBRARIES,
    SPEC_RULES,
    missing_library_problems,
    parameter_problems,
    preload_entries,
    refusal_reason,
)


def obj(parameters: dict[str, Any], version: str = "18") -> dict[str, Any]:
    spec = {"replicas": 1, "version": version, "storage": "1Gi", "postgresql": {"parameters": parameters}}
    return {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u1"}, "spec": spec}


def refused(parameters: dict[str, Any], version: str = "18") -> str:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(obj(parameters, version))
    return str(info.value)


def kept(parameters: dict[str, str], version: str = "18") -> dict[str, str]:
    return dict(PostgresCluster.from_obj(obj(parameters, version)).spec.postgresql.parameters)


@pytest.mark.parametrize(
    "value",
    [
        "pg_stat_statements",
        "pg_stat_statements,auto_explain",
        " pg_stat_statements , auto_explain,pg_prewarm, pgaudit ",
        "",  # preloads nothing
    ],
)
def test_libraries_on_the_allow_list_are_admitted(value: str) -> None:
    params = {"shared_preload_libraries": value, "pg_stat_statements.track": "all"}
    assert kept(params) == params


def test_the_allow_list_names_at_least_what_teams_ask_for() -> None:
    assert set(PRELOADABLE_LIBRARIES) >= {"pg_stat_statements", "auto_explain", "pg_prewarm", "pgaudit"}


@pytest.mark.parametrize(
    ("value", "entry"),
    [
        ("pg_stat_statements,evil", "evil"),
        ("$libdir/pg_stat_statements", "$libdir/pg_stat_statements"),  # a path, not a name
        ('"pg_stat_statements"', '"pg_stat_statements"'),  # quoted: only bare names
        ("/var/lib/postgresql/data/x.so", "/var/lib/postgresql/data/x.so"),
        ("pg_stat_statements,,auto_explain", ""),  # an empty entry between commas
        ("PG_STAT_STATEMENTS", "PG_STAT_STATEMENTS"),  # file names are exact
    ],
)
def test_an_entry_off_the_allow_list_is_refused_naming_it(value: str, entry: str) -> None:
    msg = refused({"shared_preload_libraries": value})
    assert msg.startswith("spec.postgresql.parameters: shared_preload_libraries: ")
    assert f"{entry!r} is not a library the operator allows preloading" in msg


def test_each_bad_entry_is_named() -> None:
    problems = parameter_problems({"shared_preload_libraries": "a, pgaudit, b"})
    assert [p.split(":")[1].strip() for p in problems] == ["'a' is not a library the operator allows "
                                                           "preloading (entries must be among auto_explain, "
                                                           "pg_prewarm, pg_stat_statements, pgaudit, "
                                                           "separated by commas)", "'b' is not a library the "
                                                           "operator allows preloading (entries must be "
                                                           "among auto_explain, pg_prewarm, "
                                                           "pg_stat_statements, pgaudit, separated by "
                                                           "commas)"]  # fmt: skip


def test_the_other_library_settings_stay_refused() -> None:
    assert refusal_reason("shared_preload_libraries") is None
    for name in ("session_preload_libraries", "local_preload_libraries", "myext.extra_libraries"):
        assert refusal_reason(name) == LOADS_CODE, name


def test_preload_entries_read_the_list_as_postgresql_does_for_bare_names() -> None:
    assert preload_entries("") == []
    assert preload_entries("  ") == []
    assert preload_entries("a, b ,c") == ["a", "b", "c"]


@pytest.mark.parametrize("version", ["16", "17"])
def test_pgaudit_is_refused_where_the_image_lacks_it(version: str) -> None:
    msg = refused({"shared_preload_libraries": "pg_stat_statements,pgaudit"}, version)
    assert msg == (
        f"spec.postgresql.parameters: shared_preload_libraries: pgaudit is not in the image of PostgreSQL "
        f"{version}"
    )
    assert kept({"shared_preload_libraries": "pg_stat_statements"}, version)


@pytest.mark.parametrize("version", ["15", "18"])
def test_pgaudit_is_admitted_where_the_image_has_it(version: str) -> None:
    assert missing_library_problems({"shared_preload_libraries": "pgaudit"}, version) == []
    assert kept({"shared_preload_libraries": "pgaudit"}, version)


def with_database(parameters: dict[str, str], extensions: list[str]) -> dict[str, Any]:
    body = obj(parameters)
    body["spec"]["databases"] = [{"name": "shop", "owner": "app", "extensions": extensions}]
    return body


def test_a_database_may_declare_pgaudit_only_when_it_is_preloaded() -> None:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(
            with_database({"shared_preload_libraries": "pg_stat_statements"}, ["pgaudit"])
        )
    assert str(info.value) == (
        "spec.databases: extension pgaudit needs pgaudit in postgresql.parameters.shared_preload_libraries"
    )
    admitted = with_database(
        {"shared_preload_libraries": "pg_stat_statements, pgaudit"}, ["pgaudit", "vector"]
    )
    assert PostgresCluster.from_obj(admitted).spec.databases
    # Extensions that load without a preload need none.
    assert PostgresCluster.from_obj(with_database({}, ["vector", "pg_stat_statements"])).spec.databases


# --- pgaudit's settings ---------------------------------------------------------------------------------


def test_pgaudit_settings_are_admitted() -> None:
    params = {
        "shared_preload_libraries": "pgaudit",
        "pgaudit.log": "ddl, write, -misc",
        "pgaudit.log_catalog": "off",
        "pgaudit.log_parameter": "on",
        "pgaudit.log_relation": "true",
        "pgaudit.log_level": "notice",
        "pgaudit.log_parameter_max_size": "1024",
        "pgaudit.role": "auditor",
    }
    assert kept(params) == params


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("pgaudit.log", "ddl,everything", "'everything' is not a pgaudit class"),
        ("pgaudit.log_catalog", "maybe", "'maybe' is not a boolean"),
        ("pgaudit.log_level", "error", "'error' is not one of debug1"),
        ("pgaudit.log_parameter_max_size", "-1", "'-1' is not a size in bytes"),
        ("pgaudit.unknown", "on", "pgaudit.unknown is not a pgaudit setting (pgaudit.log, "),
        ("pgaudit.role", "postgres", "postgres is one of the operator's roles"),
        ("pgaudit.role", "replicator", "replicator is one of the operator's roles"),
        ("pgaudit.role", "pg_read_all_data", "'pg_read_all_data' is not a role name"),
        ("pgaudit.role", "Auditor", "'Auditor' is not a role name"),
        ("pgaudit.role", "a'; drop", "is not a role name"),
    ],
)
def test_bad_pgaudit_settings_are_refused_naming_them(name: str, value: str, words: str) -> None:
    msg = refused({name: value})
    assert msg.startswith(f"spec.postgresql.parameters: {name}")
    assert words in msg


# --- the CRD's rules ------------------------------------------------------------------------------------


def _rule_with(text: str) -> dict[str, str]:
    (found,) = [r for r in PARAMETER_RULES if text in r["rule"]]
    return found


def test_the_crd_checks_each_preloaded_entry_against_the_same_list() -> None:
    found = _rule_with("shared_preload_libraries'].split(',')")
    for library in PRELOADABLE_LIBRARIES:
        assert f"'{library}'" in found["rule"]
    assert "shared_preload_libraries" in found["message"]


def test_the_crd_no_longer_refuses_shared_preload_libraries_by_name_or_suffix() -> None:
    lookups = [r for r in PARAMETER_RULES if r["rule"] == "!('shared_preload_libraries' in self)"]
    assert lookups == []
    suffix = _rule_with("!k.endsWith('_libraries')")
    assert "'shared_preload_libraries'" in suffix["rule"]


def test_the_crd_names_every_pgaudit_setting_and_guards_the_role() -> None:
    names = _rule_with("!k.startsWith('pgaudit.')")
    for setting in PGAUDIT_SETTINGS:
        assert f"'pgaudit.{setting}'" in names["rule"]
    role = _rule_with("'pgaudit.role' in self")
    assert "'postgres'" in role["rule"] and "startsWith('pg_')" in role["rule"]


def test_the_generated_crd_carries_the_version_rule() -> None:
    spec = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for r in SPEC_RULES:
        assert r in spec["x-kubernetes-validations"]
    missing, preload_only = SPEC_RULES
    assert "['16', '17']" in missing["rule"] and "'pgaudit'" in missing["rule"]
    assert "self.databases.exists(d, has(d.extensions) && 'pgaudit' in d.extensions)" in preload_only["rule"]
