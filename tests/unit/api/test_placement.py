"""Label keys and values as the API server checks them on a pod template: nodeSelector, topologyKey and
tolerations admit what a StatefulSet may carry and refuse the rest, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.placement import is_label_key, is_label_value

PREFIX_253 = ".".join(["a" * 63] * 4)[:253].rstrip(".")  # a DNS subdomain of (nearly) the longest length


def obj(**spec: Any) -> dict[str, Any]:
    base = {"replicas": 1, "version": "16", "storage": "1Gi"}
    return {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u1"}, "spec": base | spec}


def refused(**spec: Any) -> str:
    with pytest.raises(ValueError) as info:
        PostgresCluster.from_obj(obj(**spec))
    return str(info.value)


@pytest.mark.parametrize(
    "key",
    ["disk", "kubernetes.io/hostname", "topology.kubernetes.io/zone", "a", "A_b.c-D",
     f"example.com/{'n' * 63}", f"{PREFIX_253}/n"],
)  # fmt: skip
def test_label_keys_kubernetes_accepts(key: str) -> None:
    assert is_label_key(key)


@pytest.mark.parametrize(
    "key",
    ["", "a b", "n" * 64, f"example.com/{'n' * 64}", f"{'a' * 254}/n", "/n", "a/b/c", "Example.com/n", "-a",
     "a-", "disk\n", "disk\t", "ünï"],
)  # fmt: skip
def test_label_keys_kubernetes_refuses(key: str) -> None:
    assert not is_label_key(key)


@pytest.mark.parametrize("value", ["", "ssd", "v" * 63, "A.b_c-9"])
def test_label_values_kubernetes_accepts(value: str) -> None:
    assert is_label_value(value)


@pytest.mark.parametrize("value", ["v" * 64, "a b", "-a", "a.", "ssd\n", "a/b"])
def test_label_values_kubernetes_refuses(value: str) -> None:
    assert not is_label_value(value)


def test_node_selector_refuses_bad_keys_and_values_naming_them() -> None:
    msg = refused(nodeSelector={"a b": "x", "disk": "s s", "zone": "eu-1"})
    assert msg.startswith("spec.nodeSelector: 'a b' must be a label key")
    assert "the value of disk must be a label value" in msg and "zone" not in msg
    assert "spec.nodeSelector.ok" in refused(nodeSelector={"ok": "v" * 64})


def test_node_selector_admits_the_longest_label() -> None:
    selector = {f"example.com/{'n' * 63}": "v" * 63, "disk": ""}
    assert PostgresCluster.from_obj(obj(nodeSelector=selector)).spec.node_selector == selector


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"affinity": {"topologyKey": "n" * 64}}, "spec.affinity.topologyKey must be a label key"),
        ({"tolerations": [{"key": "a b"}]}, "spec.tolerations.0.key: key must be a label key"),
        (
            {"tolerations": [{"key": "k", "value": "a b"}]},
            "spec.tolerations.0.value: value must be a label value",
        ),
    ],
)
def test_topology_key_and_tolerations_are_label_keys_and_values(spec: dict[str, Any], message: str) -> None:
    assert refused(**spec).startswith(message)
