"""spec.bootstrap.import: what the model accepts and refuses, each refusal naming the field, and the CEL
rules the CRD carries for the same checks."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from harness.objects import cluster_model
from pg_operator.api.bootstrap_import import ImportBootstrap
from pg_operator.api.cluster import POSTGRES_CLUSTER
from pg_operator.api.crd import build


def source(**extra: Any) -> dict[str, Any]:
    return {"host": "old-db.legacy.svc", "user": "reader", "passwordSecret": {"name": "old-db-reader"},
            "sslMode": "require", **extra}  # fmt: skip


def spec(**extra: Any) -> dict[str, Any]:
    return {"source": source(), "databases": ["shop"], **extra}


def test_defaults() -> None:
    parsed = ImportBootstrap.model_validate(spec())
    assert (parsed.mode, parsed.jobs, parsed.source.port) == ("microservice", 1, 5432)
    assert parsed.source.password_secret.key == "password"


def test_on_the_cluster_under_its_json_name() -> None:
    cluster = cluster_model(bootstrap={"import": spec(jobs=2)})
    imported = cluster.spec.bootstrap.import_
    assert imported is not None and imported.jobs == 2 and imported.databases == ["shop"]


def test_recovery_and_import_together_are_refused() -> None:
    recovery = {
        "source": {"clusterName": "old", "s3": {"bucket": "backups", "credentials": {"secretName": "s"}}}
    }
    with pytest.raises(ValueError, match=r"spec\.bootstrap: set at most one of recovery and import"):
        cluster_model(bootstrap={"import": spec(), "recovery": recovery})


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("host", "db; rm -rf /", "host"),
        ("host", "a host", "host"),
        ("host", "-oProxyCommand=x", "host"),
        ("user", "bob' OR 1=1", "user"),
        ("user", "host=evil", "user"),
        ("port", 0, "port"),
        ("sslMode", "verify-everything", "sslMode"),
    ],
)
def test_hostile_source_values_are_refused_naming_the_field(field: str, value: Any, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        ImportBootstrap.model_validate(spec(source=source(**{field: value})))
    assert where in str(err.value)


@pytest.mark.parametrize("db", ["shop db", "dbname=postgres host=evil", "a/b", "", "x" * 64, "'q'"])
def test_hostile_database_names_are_refused(db: str) -> None:
    with pytest.raises(ValidationError, match="databases"):
        ImportBootstrap.model_validate(spec(databases=[db]))


def test_microservice_imports_exactly_one_database() -> None:
    with pytest.raises(ValidationError, match="databases"):
        ImportBootstrap.model_validate(spec(databases=["a", "b"]))
    with pytest.raises(ValidationError, match="databases"):
        ImportBootstrap.model_validate(spec(databases=[]))


@pytest.mark.parametrize("jobs", [0, 9, -1])
def test_jobs_are_bounded(jobs: int) -> None:
    with pytest.raises(ValidationError, match="jobs"):
        ImportBootstrap.model_validate(spec(jobs=jobs))


def test_verifying_tls_needs_a_ca_and_the_ca_one_place() -> None:
    with pytest.raises(ValidationError, match=r"source\.ca is required"):
        ImportBootstrap.model_validate(spec(source=source(sslMode="verify-full")))
    with pytest.raises(ValidationError, match="exactly one of secretName and configMapName"):
        ImportBootstrap.model_validate(spec(source=source(sslMode="verify-full", ca={"key": "ca.crt"})))
    with pytest.raises(ValidationError, match="useless with sslMode disable"):
        ImportBootstrap.model_validate(spec(source=source(sslMode="disable", ca={"secretName": "ca"})))
    ok = ImportBootstrap.model_validate(
        spec(source=source(sslMode="verify-full", ca={"configMapName": "ca"}))
    )
    assert ok.source.ca is not None and ok.source.ca.config_map_name == "ca"


def _rules(schema: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in schema.get("x-kubernetes-validations") or ()]


def test_the_crd_carries_the_same_rules() -> None:
    root = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    bootstrap = root["properties"]["spec"]["properties"]["bootstrap"]
    assert "!(has(self.recovery) && has(self.__import__))" in _rules(bootstrap)
    imported = bootstrap["properties"]["import"]
    assert any("size(self.databases) == 1" in r for r in _rules(imported))
    assert any("has(self.source.ca)" in r for r in _rules(imported))
    src = imported["properties"]["source"]["properties"]
    assert src["host"]["pattern"].startswith("^") and src["user"]["pattern"].startswith("^")
    assert imported["properties"]["databases"]["items"]["pattern"].startswith("^")
    assert imported["properties"]["jobs"]["maximum"] == 8
    status = root["properties"]["status"]["properties"]["import"]["properties"]["phase"]
    assert status["enum"] == ["Pending", "Dumping", "Restoring", "Succeeded", "Failed"]
