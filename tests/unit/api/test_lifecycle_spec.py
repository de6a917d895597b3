"""spec.hibernation and spec.fencedInstances: defaults, names that must be this cluster's instances (or
'*' alone), refused by the model naming the field and carried as a root CEL rule in the CRD."""

from __future__ import annotations

import pytest

from harness.objects import cluster_model
from pg_operator.api.cluster import POSTGRES_CLUSTER
from pg_operator.api.crd import build
from pg_operator.api.lifecycle import fenced_names, fencing_problems


def test_defaults_run_every_instance() -> None:
    spec = cluster_model().spec
    assert spec.hibernation is False and spec.fenced_instances is None


@pytest.mark.parametrize("fenced", [["orders-db-0"], ["orders-db-2", "orders-db-1"], ["*"]])
def test_instances_of_the_cluster_may_be_fenced(fenced: list[str]) -> None:
    assert cluster_model(fencedInstances=fenced, hibernation=True).spec.fenced_instances == fenced


@pytest.mark.parametrize(
    ("fenced", "why"),
    [
        (["orders-db-3"], "'orders-db-3' is not an instance of cluster 'orders-db'"),
        (["other-db-0"], "'other-db-0' is not an instance"),
        (["orders-db-01"], "'orders-db-01' is not an instance"),
        (["orders-db-x"], "'orders-db-x' is not an instance"),
        (["*", "orders-db-0"], "must stand alone"),
        (["orders-db-0", "orders-db-0"], "listed twice"),
    ],
)
def test_anything_else_is_refused_naming_the_field(fenced: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=r"spec\.fencedInstances") as refused:
        cluster_model(fencedInstances=fenced)
    assert why in str(refused.value)


def test_the_rules_name_the_bounds_by_the_cluster_size() -> None:
    assert fencing_problems("db", 5, ["db-4"]) == []
    assert fencing_problems("db", 4, ["db-4"]) != []


def test_star_expands_to_every_instance() -> None:
    assert fenced_names("db", 3, ["*"]) == {"db-0", "db-1", "db-2"}
    assert fenced_names("db", 3, ["db-1"]) == {"db-1"}
    assert fenced_names("db", 3, None) == frozenset()


def test_the_crd_refuses_the_same_at_its_root() -> None:
    schema = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r for r in schema["x-kubernetes-validations"] if r.get("fieldPath") == ".spec.fencedInstances"]
    assert len(rules) == 2 and "self.metadata.name + '-'" in rules[0]["rule"]
    fenced = schema["properties"]["spec"]["properties"]["fencedInstances"]
    assert fenced["maxItems"] == 5 and fenced["items"]["maxLength"] == 63
    assert schema["properties"]["spec"]["properties"]["hibernation"]["type"] == "boolean"
