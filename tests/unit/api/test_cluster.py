"""The spec models: defaults, and refusal of bad input with an error naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pg_operator.api.cluster import PostgresCluster, PostgresClusterSpec
from pg_operator.api.postgresql import OPERATOR_OWNED_PARAMETERS
from pg_operator.images import SUPPORTED_MAJORS


def obj(name: str = "orders-db", **spec: Any) -> dict[str, Any]:
    base = {"replicas": 3, "version": "16", "storage": "20Gi"}
    return {
        "metadata": {"name": name, "namespace": "shop", "uid": "uid-1", "generation": 4},
        "spec": base | spec,
    }


def refused(o: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(o)
    return str(info.value)


def test_minimal_spec_gets_every_default() -> None:
    c = PostgresCluster.from_obj(obj())
    assert (c.name, c.namespace, c.uid, c.generation) == ("orders-db", "shop", "uid-1", 4)
    s = c.spec
    assert (s.replicas, s.version, s.storage, s.storage_gi) == (3, "16", "20Gi", 20)
    assert s.image is None and s.storage_class_name is None and s.image_pull_policy == "IfNotPresent"
    assert (s.resources.requests.cpu, s.resources.requests.memory) == ("250m", "512Mi")
    assert s.resources.limits.cpu is None and s.memory_limit == "512Mi"
    assert s.postgresql.parameters == {} and s.postgresql.allowed_cidrs == ["0.0.0.0/0", "::/0"]
    assert s.affinity.pod_anti_affinity == "auto" and s.affinity.topology_key == "kubernetes.io/hostname"
    assert s.affinity.zone_spread == "preferred"
    assert s.affinity.zone_topology_key == "topology.kubernetes.io/zone"
    assert s.disruption.single_instance == "Evict"
    assert (s.synchronous.number, s.synchronous.data_durability) == (0, "required")
    assert (s.bootstrap.initdb.database, s.bootstrap.initdb.owner) == ("app", "app")
    assert (s.patroni.ttl, s.patroni.loop_wait, s.patroni.retry_timeout) == (20, 5, 5)


def test_camel_case_fields_and_integer_quantities() -> None:
    c = PostgresCluster.from_obj(
        obj(
            storageClassName="fast",
            imagePullPolicy="Never",
            resources={"requests": {"cpu": 1, "memory": "1Gi"}, "limits": {"cpu": 2, "memory": "2Gi"}},
            synchronous={"number": 1, "dataDurability": "preferred"},
            affinity={"podAntiAffinity": "required"},
        )
    )
    assert c.spec.storage_class_name == "fast" and c.spec.image_pull_policy == "Never"
    assert (c.spec.resources.requests.cpu, c.spec.resources.limits.cpu) == ("1", "2")
    assert c.spec.memory_limit == "2Gi"
    assert c.spec.synchronous.data_durability == "preferred"


def test_versions_are_the_supported_majors() -> None:
    assert SUPPORTED_MAJORS == ("15", "16", "17", "18")
    for major in SUPPORTED_MAJORS:
        assert PostgresCluster.from_obj(obj(version=major)).spec.version == major


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": 9}, "spec.replicas"),
        ({"replicas": 0}, "spec.replicas"),
        ({"version": "14"}, "spec.version"),
        ({"version": 16}, "spec.version"),
        ({"storage": "20GB"}, "spec.storage"),
        ({"storage": "0Gi"}, "spec.storage"),
        ({"storage": "1.5Gi"}, "spec.storage"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"storageClassName": "Not_A_Name"}, "spec.storageClassName"),
        ({"resources": {"requests": {"memory": "lots"}}}, "spec.resources.requests.memory"),
        ({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}, "spec.resources"),
        ({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}}, "spec.resources"),
        ({"synchronous": {"number": 3}}, "spec.synchronous.number"),
        ({"synchronous": {"number": 5}, "replicas": 5}, "spec.synchronous.number"),
        ({"synchronous": {"dataDurability": "maybe"}}, "spec.synchronous.dataDurability"),
        ({"affinity": {"podAntiAffinity": "always"}}, "spec.affinity.podAntiAffinity"),
        ({"bootstrap": {"initdb": {"database": "postgres"}}}, "spec.bootstrap.initdb.database"),
        ({"bootstrap": {"initdb": {"database": "Orders"}}}, "spec.bootstrap.initdb.database"),
        ({"bootstrap": {"initdb": {"owner": "replicator"}}}, "spec.bootstrap.initdb.owner"),
        ({"bootstrap": {"initdb": {"owner": "pg_monitor"}}}, "spec.bootstrap.initdb.owner"),
        ({"bootstrap": {"initdb": {"owner": "a" * 64}}}, "spec.bootstrap.initdb.owner"),
        ({"patroni": {"ttl": 10, "loopWait": 5, "retryTimeout": 5}}, "spec.patroni"),
        ({"postgresql": {"allowedCIDRs": ["10.0.0.0/33"]}}, "spec.postgresql.allowedCIDRs"),
        ({"postgresql": {"parameters": {"shared_buffers": 256}}}, "spec.postgresql.parameters"),
        ({"postgresql": {"parameters": {"Shared_Buffers": "1GB"}}}, "spec.postgresql.parameters"),
        ({"unknownField": 1}, "spec.unknownField"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.tolerations.0"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}, "spec.tolerations.0"),
        (
            {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
            "spec.tolerations.0",
        ),
        ({"tolerations": [{"key": "k", "effect": "Never"}]}, "spec.tolerations.0.effect"),
        ({"priorityClassName": "High"}, "spec.priorityClassName"),
        ({"image": "postgres:16 "}, "spec.image"),
        ({"image": "postgres:16\nx"}, "spec.image"),
    ],
)
def test_bad_spec_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    assert field in refused(obj(**spec))


@pytest.mark.parametrize("parameter", OPERATOR_OWNED_PARAMETERS)
def test_operator_owned_parameters_are_refused(parameter: str) -> None:
    msg = refused(obj(postgresql={"parameters": {parameter: "x", "work_mem": "64MB"}}))
    assert f"spec.postgresql.parameters: {parameter} is set by the operator" in msg
    assert "work_mem" not in msg


def test_owned_parameters_cover_replication_archiving_and_layout() -> None:
    for p in (
        "port",
        "listen_addresses",
        "wal_level",
        "hot_standby",
        "archive_mode",
        "archive_command",
        "restore_command",
        "max_wal_senders",
        "max_replication_slots",
        "wal_log_hints",
        "data_directory",
        "hba_file",
        "ident_file",
        "config_file",
        "unix_socket_directories",
        "primary_conninfo",
    ):
        assert p in OPERATOR_OWNED_PARAMETERS


def test_user_parameters_are_kept() -> None:
    params = {"shared_buffers": "256MB", "max_connections": "200", "auto_explain.log_min_duration": "1s"}
    assert (
        PostgresCluster.from_obj(obj(postgresql={"parameters": params})).spec.postgresql.parameters == params
    )


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"namespace": "shop", "uid": "u"}, "metadata.name"),
        ({"name": "a", "uid": "u"}, "metadata.namespace"),
        ({"name": "a", "namespace": "shop"}, "metadata.uid"),
        ({"name": "x" * 51, "namespace": "shop", "uid": "u"}, "metadata.name"),
        ({"name": "1db", "namespace": "shop", "uid": "u"}, "metadata.name"),
    ],
)
def test_bad_metadata_is_refused(metadata: dict[str, Any], field: str) -> None:
    assert field in refused({"metadata": metadata, "spec": obj()["spec"]})


def test_missing_spec_and_required_fields() -> None:
    assert "spec" in refused({"metadata": obj()["metadata"]})
    for key in ("replicas", "version", "storage"):
        spec = obj()["spec"]
        del spec[key]
        assert f"spec.{key}" in refused({"metadata": obj()["metadata"], "spec": spec})


def test_spec_round_trips_through_its_wire_form() -> None:
    spec = PostgresCluster.from_obj(obj(storageClassName="fast")).spec
    wire = spec.model_dump(by_alias=True, exclude_none=True)
    assert wire["storageClassName"] == "fast" and "image" not in wire
    assert PostgresClusterSpec.model_validate(wire) == spec


def test_the_example_applies_as_is() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "orders-db.yaml"
    namespace, pgc = yaml.safe_load_all(example.read_text(encoding="utf-8"))
    assert namespace == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
    assert pgc["apiVersion"] == "db.example.com/v1alpha1" and pgc["kind"] == "PostgresCluster"
    pgc["metadata"]["uid"] = "uid-from-the-api-server"
    c = PostgresCluster.from_obj(pgc)
    assert (c.name, c.namespace, c.spec.replicas, c.spec.version, c.spec.storage) == (
        "orders-db",
        "shop",
        3,
        "16",
        "20Gi",
    )
