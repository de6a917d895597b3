"""spec.pooler on the real API server (generated CRD, kwok profile): bad input refused with a message
naming the field; a minimal pooler admitted with its defaults, and removed again."""

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

    def get(self, name: str) -> dict[str, Any]:
        got = self.kube.kubectl("-n", self.ns, "get", "pgc", name, "-o", "json")
        out: dict[str, Any] = json.loads(got.stdout)
        return out


@pytest.fixture(scope="module")
def api(kube: Any) -> Iterator[Api]:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pg-operator-tests",
                 "-f", "-", input=render(POSTGRES_CLUSTER))  # fmt: skip
    wait_established(kube, "crd/postgresclusters.db.example.com")
    ns = f"pooler-admission-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    try:
        yield Api(kube, ns)
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize(
    ("pooler", "needles"),
    [
        ({"instances": 0}, ["spec.pooler.instances", "greater than or equal to 1"]),
        ({"instances": 11}, ["spec.pooler.instances", "less than or equal to 10"]),
        ({"mode": "statement"}, ["spec.pooler.mode", "Unsupported value"]),
        ({"readOnly": "yes"}, ["spec.pooler.readOnly"]),
        ({"defaultPoolSize": 0}, ["spec.pooler.defaultPoolSize"]),
        (
            {"defaultPoolSize": 50, "maxClientConnections": 10},
            ["spec.pooler.defaultPoolSize", "must not exceed pooler.maxClientConnections"],
        ),
        ({"resources": {"requests": {"cpu": "lots"}}}, ["spec.pooler.resources.requests.cpu"]),
        (
            {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
            ["spec.pooler.resources.requests.memory", "must not exceed pooler.resources.limits.memory"],
        ),
    ],
)
def test_bad_pooler_input_is_refused_naming_the_field(api: Api, pooler: dict[str, Any],
                                                      needles: list[str]) -> None:  # fmt: skip
    result = api.create(f"bad-{secrets.token_hex(3)}", pooler=pooler)
    assert result.returncode != 0, f"the API server accepted it:\n{result.stdout}"
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"


def test_an_empty_pooler_is_admitted_with_its_defaults(api: Api) -> None:
    result = api.create("pooled", pooler={})
    assert result.returncode == 0, result.stderr
    body = api.get("pooled")
    requests = {"cpu": "50m", "memory": "64Mi"}
    assert body["spec"]["pooler"] == {
        "instances": 2,
        "mode": "transaction",
        "readOnly": False,
        "resources": {"limits": {}, "requests": requests},
    }
    parsed = PostgresCluster.from_obj(body).spec.pooler
    assert parsed is not None and parsed.instances == 2
