"""Admission rules of spec.roles and spec.databases as the operator checks them (the CRD's CEL rules are
the same refusals; tests/integration/test_roles_admission.py runs those on the API server)."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster
from pg_operator.api.manifests import render


def cluster(**spec: Any) -> PostgresCluster:
    body = {"replicas": 1, "version": "16", "storage": "1Gi"} | spec
    return PostgresCluster.from_obj({"metadata": {"name": "db", "namespace": "ns", "uid": "u"}, "spec": body})


def refused(*needles: str, **spec: Any) -> None:
    with pytest.raises(ValueError) as err:
        cluster(**spec)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_a_full_declaration_is_accepted_with_defaults() -> None:
    c = cluster(
        roles=[
            {"name": "orders", "inRoles": ["pg_read_all_data"], "validUntil": "2030-01-01T00:00:00Z"},
            {"name": "readers", "login": False},
        ],
        databases=[
            {
                "name": "orders",
                "owner": "orders",
                "extensions": ["pg_trgm", "uuid-ossp"],
                "schemas": [{"name": "sales", "owner": "readers"}],
                "encoding": "UTF8",
                "locale": "C.UTF-8",
            }
        ],
    )
    assert c.spec.roles is not None and c.spec.roles[0].login and not c.spec.roles[0].createdb
    assert c.spec.roles[0].connection_limit == -1
    assert c.spec.removal_policy.roles == "retain" and c.spec.removal_policy.databases == "retain"


@pytest.mark.parametrize("name", ["postgres", "replicator", "pgop_monitor", "patroni", "public", "pg_admin"])
def test_reserved_role_names_are_refused(name: str) -> None:
    refused("spec.roles.0.name", "must not start with pg_", roles=[{"name": name}])


@pytest.mark.parametrize("name", ["Alice", "a-b", "ends_", "x" * 64, "1abc", 'a"b'])
def test_role_names_must_be_plain_identifiers(name: str) -> None:
    refused("spec.roles.0.name", roles=[{"name": name}])


def test_superuser_and_replication_cannot_be_declared() -> None:
    refused("spec.roles.0.superuser", roles=[{"name": "boss", "superuser": True}])
    refused("spec.roles.0.replication", roles=[{"name": "rep", "replication": True}])


def test_the_application_owner_cannot_be_declared() -> None:
    refused("application owner", roles=[{"name": "app", "passwordSecret": {"name": "mine"}}])
    refused("application owner", roles=[{"name": "owner"}], bootstrap={"initdb": {"owner": "owner"}})


def test_a_generated_secret_may_not_take_an_operator_secret_name() -> None:
    refused("spec.roles.0: name:", "operator's", roles=[{"name": "server_tls"}])
    refused("operator's", roles=[{"name": "superuser"}])
    cluster(roles=[{"name": "superuser", "login": False}])
    cluster(roles=[{"name": "superuser", "passwordSecret": {"name": "mine"}}])


def test_unsafe_and_reserved_memberships_are_refused() -> None:
    refused(
        "spec.roles.0.inRoles",
        "pg_execute_server_program",
        roles=[{"name": "a", "inRoles": ["pg_execute_server_program"]}],
    )
    refused("spec.roles.0.inRoles", "postgres", roles=[{"name": "a", "inRoles": ["postgres"]}])
    refused("inRoles must not name the role itself", roles=[{"name": "a", "inRoles": ["a"]}])


def test_createrole_is_refused_on_15_only() -> None:
    """On 15 CREATEROLE can grant pg_execute_server_program; from 16 it administers only its own roles."""
    refused("createrole is refused on version 15", version="15", roles=[{"name": "a", "createrole": True}])
    assert cluster(version="15", roles=[{"name": "a"}]).spec.roles
    assert cluster(version="16", roles=[{"name": "a", "createrole": True}]).spec.roles


def test_duplicates_are_refused() -> None:
    refused("roles: duplicate names", roles=[{"name": "a"}, {"name": "a"}])
    refused(
        "databases: duplicate names",
        roles=[{"name": "a"}],
        databases=[{"name": "d", "owner": "a"}, {"name": "d", "owner": "a"}],
    )
    refused(
        "schemas: duplicate names",
        databases=[{"name": "d", "owner": "app", "schemas": [{"name": "s"}, {"name": "s"}]}],
    )


@pytest.mark.parametrize("name", ["postgres", "template0", "template1"])
def test_system_databases_are_refused(name: str) -> None:
    refused("spec.databases.0.name", "must not be one of", databases=[{"name": name, "owner": "app"}])


def test_the_application_database_cannot_be_declared() -> None:
    refused("application database", databases=[{"name": "app", "owner": "app"}])


def test_owners_must_be_declared_roles_or_the_application_owner() -> None:
    refused("each owner must be", databases=[{"name": "d", "owner": "nobody"}])
    refused(
        "each schema owner must be",
        databases=[{"name": "d", "owner": "app", "schemas": [{"name": "s", "owner": "nobody"}]}],
    )
    cluster(databases=[{"name": "d", "owner": "app", "schemas": [{"name": "s"}]}])


def test_system_schema_names_are_refused() -> None:
    for name in ("public", "pg_temp", "information_schema"):
        refused(
            "spec.databases.0.schemas.0.name",
            databases=[{"name": "d", "owner": "app", "schemas": [{"name": name}]}],
        )


def test_password_secret_and_policy_values_are_checked() -> None:
    refused("spec.roles.0.passwordSecret.name", roles=[{"name": "a", "passwordSecret": {"name": "Bad_Name"}}])
    refused("spec.removalPolicy.roles", removalPolicy={"roles": "drop"})


def test_the_crd_carries_the_same_rules() -> None:
    crd = render(POSTGRES_CLUSTER)
    for needle in (
        "x-kubernetes-list-map-keys",
        "self.roles.all(r, r.name != self.bootstrap.initdb.owner)",
        "encoding is applied when the database is created and cannot change",
        "pg_execute_server_program",
        "must not start with pg_",
        "self.roles.all(r, !has(r.createrole) || !r.createrole)",
    ):
        assert needle in crd
