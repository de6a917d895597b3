"""spec.roles, spec.databases and spec.removalPolicy on the real API server (generated CRD, kwok profile):
reserved and system names, superuser/replication attributes, owners that are not declared, duplicates,
unsafe memberships and Secret-name collisions are refused with a message naming the field; encoding and
locale cannot change once declared; a full declaration is admitted with its defaults."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.kube import wait_established
from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster
from pg_operator.api.manifests import render

pytestmark = pytest.mark.integration


class Api:
    def __init__(self, kube: Any, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace

    def create(self, name: str, **spec: Any) -> Any:
        body = {
            "apiVersion": "db.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"replicas": 1, "version": "16", "storage": "1Gi"} | spec,
        }
        return self.kube.kubectl("-n", self.ns, "create", "-f", "-", input=yaml.safe_dump(body), check=False)

    def patch(self, name: str, spec: dict[str, Any]) -> Any:
        return self.kube.kubectl("-n", self.ns, "patch", "pgc", name, "--type=merge", "-p",
                                 json.dumps({"spec": spec}), check=False)  # fmt: skip

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(
            self.kube.kubectl("-n", self.ns, "get", "pgc", name, "-o", "json").stdout
        )
        return out


def refused(result: Any, *needles: str) -> None:
    assert result.returncode != 0, f"the API server accepted it:\n{result.stdout}"
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"


@pytest.fixture(scope="module")
def api(kube: Any) -> Iterator[Api]:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pg-operator-tests",
                 "-f", "-", input=render(POSTGRES_CLUSTER))  # fmt: skip
    wait_established(kube, "crd/postgresclusters.db.example.com")
    ns = f"roles-admission-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    try:
        yield Api(kube, ns)
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


FULL: dict[str, list[dict[str, Any]]] = {
    "roles": [
        {"name": "orders", "inRoles": ["readers", "pg_read_all_data"], "validUntil": "2030-01-01T00:00:00Z"},
        {"name": "readers", "login": False},
        {"name": "carol", "passwordSecret": {"name": "carol-password"}},
    ],
    "databases": [
        {"name": "shop", "owner": "orders", "extensions": ["pg_trgm", "uuid-ossp"], "encoding": "UTF8",
         "locale": "C.UTF-8", "schemas": [{"name": "sales", "owner": "readers"}, {"name": "audit"}]},
    ],
}  # fmt: skip


def test_a_full_declaration_is_admitted_with_defaults_the_operator_accepts(api: Api) -> None:
    assert api.create("full", **FULL).returncode == 0
    body = api.get("full")
    roles = {r["name"]: r for r in body["spec"]["roles"]}
    assert roles["orders"]["login"] is True and roles["orders"]["connectionLimit"] == -1
    assert roles["carol"]["passwordSecret"] == {"name": "carol-password", "key": "password"}
    assert body["spec"]["removalPolicy"] == {"roles": "retain", "databases": "retain"}
    body["metadata"]["uid"] = body["metadata"].get("uid") or "x"
    parsed = PostgresCluster.from_obj(body)  # what the API server admits, the operator accepts
    assert parsed.spec.databases is not None and parsed.spec.databases[0].schemas[1].owner is None


@pytest.mark.parametrize("name", ["postgres", "replicator", "pgop_monitor", "patroni", "pg_signal", "public"])
def test_reserved_role_names_are_refused(api: Api, name: str) -> None:
    refused(api.create(f"r-{name.replace('_', '-')}", roles=[{"name": name, "login": False}]),
            "spec.roles[0].name", "must not start with pg_")  # fmt: skip


def test_superuser_and_replication_are_not_in_the_schema(api: Api) -> None:
    # Unknown fields are pruned or refused; with --validate=strict (kubectl's default) refused by name.
    refused(api.create("boss", roles=[{"name": "boss", "superuser": True}]), "superuser")
    refused(api.create("rep", roles=[{"name": "rep", "replication": True}]), "replication")


def test_the_application_owner_and_database_cannot_be_declared(api: Api) -> None:
    refused(
        api.create("app-owner", roles=[{"name": "app", "login": False}]), "spec.roles", "application owner"
    )
    refused(api.create("app-db", databases=[{"name": "app", "owner": "app"}]), "spec.databases",
            "application database")  # fmt: skip


def test_duplicates_are_refused(api: Api) -> None:
    refused(api.create("dup-role", roles=[{"name": "a"}, {"name": "a"}]), "spec.roles[1]", "Duplicate value")
    refused(api.create("dup-db", databases=[{"name": "d", "owner": "app"}, {"name": "d", "owner": "app"}]),
            "spec.databases[1]", "Duplicate value")  # fmt: skip


@pytest.mark.parametrize("name", ["postgres", "template0", "template1"])
def test_system_databases_are_refused(api: Api, name: str) -> None:
    refused(api.create(f"db-{name}", databases=[{"name": name, "owner": "app"}]), "spec.databases[0].name",
            "must not be one of postgres, template0, template1")  # fmt: skip


def test_owners_must_be_declared(api: Api) -> None:
    refused(api.create("no-owner", databases=[{"name": "d", "owner": "ghost"}]), "spec.databases",
            "each owner must be a role in spec.roles or the application owner")  # fmt: skip
    refused(api.create("no-schema-owner", databases=[{"name": "d", "owner": "app",
                                                       "schemas": [{"name": "s", "owner": "ghost"}]}]),
            "each schema owner must be")  # fmt: skip


def test_unsafe_memberships_and_secret_collisions_are_refused(api: Api) -> None:
    refused(api.create("files", roles=[{"name": "a", "inRoles": ["pg_read_server_files"]}]),
            "spec.roles[0].inRoles[0]", "the server's files")  # fmt: skip
    refused(
        api.create("superuser-in", roles=[{"name": "a", "inRoles": ["postgres"]}]), "spec.roles[0].inRoles[0]"
    )
    refused(api.create("collide", roles=[{"name": "server_tls"}]), "spec.roles[0].name", "operator's own")
    assert api.create("no-collision", roles=[{"name": "server_tls", "login": False}]).returncode == 0


def test_createrole_is_refused_on_15(api: Api) -> None:
    refused(api.create("createrole-15", version="15", roles=[{"name": "a", "createrole": True}]),
            "spec.roles", "createrole is refused on version 15")  # fmt: skip
    assert api.create("createrole-16", roles=[{"name": "a", "createrole": True}]).returncode == 0


def test_bad_names_and_policies_are_refused(api: Api) -> None:
    refused(api.create("upper", roles=[{"name": "Orders"}]), "spec.roles[0].name")
    refused(api.create("trailing", roles=[{"name": "orders_"}]), "spec.roles[0].name")
    public = [{"name": "d", "owner": "app", "schemas": [{"name": "public"}]}]
    refused(api.create("schema-public", databases=public), "spec.databases[0].schemas[0].name")
    refused(api.create("policy", removalPolicy={"roles": "drop"}), "spec.removalPolicy.roles", '"retain"')


def test_encoding_and_locale_apply_at_creation_only(api: Api) -> None:
    assert api.create("immutable", **FULL).returncode == 0
    shop = FULL["databases"][0]
    refused(api.patch("immutable", {"databases": [shop | {"encoding": "LATIN1"}]}),
            "spec.databases[0].encoding", "cannot change")  # fmt: skip
    refused(api.patch("immutable", {"databases": [shop | {"locale": "C"}]}), "spec.databases[0].locale",
            "cannot change")  # fmt: skip
    # Other fields change freely, and a new database may choose its own.
    other = {"name": "other", "owner": "orders", "encoding": "LATIN1", "locale": "C"}
    assert api.patch("immutable", {"databases": [shop | {"extensions": ["pg_trgm"]}, other]}).returncode == 0
