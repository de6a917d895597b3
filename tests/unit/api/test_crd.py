"""The generated CRD: structural, complete, carrying the CEL rules, and identical to the committed YAML."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from pg_operator.api import manifests
from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresClusterSpec
from pg_operator.api.crd import SchemaError, build, structural_schema
from pg_operator.images import SUPPORTED_MAJORS

REPO = Path(__file__).resolve().parents[3]


def crd() -> dict[str, Any]:
    return build(POSTGRES_CLUSTER)


def version() -> dict[str, Any]:
    versions = crd()["spec"]["versions"]
    assert len(versions) == 1
    return versions[0]


def spec_schema() -> dict[str, Any]:
    return version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def rules(schema: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in schema.get("x-kubernetes-validations", [])]


def test_committed_crd_matches_the_models() -> None:
    committed = (REPO / "deploy" / "crd" / "postgresclusters.yaml").read_text(encoding="utf-8")
    assert committed == manifests.render(POSTGRES_CLUSTER), (
        "deploy/crd is stale: run `python -m pg_operator.api.manifests`"
    )
    assert manifests.drift() == []


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert manifests.main(["--check", "--out-dir", str(tmp_path)]) == 1
    assert manifests.main(["--out-dir", str(tmp_path)]) == 0
    assert manifests.main(["--check", "--out-dir", str(tmp_path)]) == 0
    target = tmp_path / "postgresclusters.yaml"
    target.write_text(target.read_text().replace("maximum: 5", "maximum: 7"))
    capsys.readouterr()
    assert manifests.main(["--check", "--out-dir", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "-                maximum: 7" in out.out and "python -m pg_operator.api.manifests" in out.err


def test_rendering_is_deterministic_and_parses_back() -> None:
    text = manifests.render(POSTGRES_CLUSTER)
    assert text == manifests.render(POSTGRES_CLUSTER)
    assert yaml.safe_load(text) == crd()


def test_identity_scope_and_names() -> None:
    c = crd()
    assert c["metadata"]["name"] == "postgresclusters.db.example.com"
    assert c["spec"]["group"] == "db.example.com" and c["spec"]["scope"] == "Namespaced"
    names = c["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "PostgresCluster",
        "postgresclusters",
        ["pgc"],
    )
    v = version()
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"


def test_printer_columns() -> None:
    cols = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    default = [c["name"] for c in version()["additionalPrinterColumns"] if not c.get("priority")]
    assert default == ["Replicas", "Ready", "Primary", "Phase", "Age"]
    assert cols["Ready"]["jsonPath"] == ".status.readyReplicas"
    assert cols["Primary"]["jsonPath"] == ".status.currentPrimary"
    assert cols["Age"]["type"] == "date"


def test_schema_is_structural() -> None:
    root = version()["schema"]["openAPIV3Schema"]
    for path, node in nodes(root):
        assert "$ref" not in node and "title" not in node and "nullable" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, path
        if node.get("type") == "object" and "properties" in node:
            assert "additionalProperties" not in node, path


def test_required_fields_and_their_constraints() -> None:
    spec = spec_schema()
    assert spec["required"] == ["replicas", "version", "storage"]
    props = spec["properties"]
    assert (props["replicas"]["minimum"], props["replicas"]["maximum"]) == (1, 5)
    assert props["version"]["enum"] == list(SUPPORTED_MAJORS)
    assert props["storage"]["pattern"] == "^[1-9][0-9]*Gi$"


def test_defaults_are_in_the_schema_and_agree_with_the_models() -> None:
    props = spec_schema()["properties"]
    model_defaults = PostgresClusterSpec(replicas=1, version="16", storage="1Gi").model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    for field in (
        "resources",
        "postgresql",
        "affinity",
        "synchronous",
        "bootstrap",
        "patroni",
        "imagePullPolicy",
    ):
        assert props[field]["default"] == model_defaults[field], field
    assert props["postgresql"]["properties"]["allowedCIDRs"]["default"] == ["0.0.0.0/0", "::/0"]
    assert props["synchronous"]["properties"]["dataDurability"]["default"] == "required"


def test_cel_rules() -> None:
    spec = spec_schema()
    props = spec["properties"]
    assert "int(self.split('Gi')[0]) >= int(oldSelf.split('Gi')[0])" in rules(props["storage"])
    assert "int(self) >= int(oldSelf)" in rules(props["version"])
    assert "self == oldSelf" in rules(props["bootstrap"])
    spec_rules = rules(spec)
    assert any("self.synchronous.number < self.replicas" in r for r in spec_rules)
    assert any("oldSelf.storageClassName" in r for r in spec_rules)
    version_rule = props["version"]["x-kubernetes-validations"][0]
    assert "never lowered" in version_rule["message"]
    assert "oldSelf + ' -> ' + self" in version_rule["messageExpression"]
    params = props["postgresql"]["properties"]["parameters"]
    assert "!('wal_level' in self)" in rules(params)
    for node_path, node in nodes(version()["schema"]["openAPIV3Schema"]):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["message"], node_path
            # A backslash only inside a raw string literal (r'...'), where it reaches RE2 as it is; in a
            # plain CEL string it would be an escape sequence.
            assert "\\" not in re.sub(r"\br'[^']*'", "", rule["rule"]), node_path


def test_status_schema_has_no_defaults_and_keyed_lists() -> None:
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert all("default" not in node for _, node in nodes(status))
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert set(status["properties"]) >= {
        "phase",
        "conditions",
        "observedGeneration",
        "readyReplicas",
        "replicas",
        "currentPrimary",
        "instances",
    }


def test_converter_refuses_shapes_it_cannot_express() -> None:
    class Union(BaseModel):
        value: int | str

    class Untyped(BaseModel):
        value: Any

    with pytest.raises(SchemaError, match=r"Union\.value"):
        structural_schema(Union)
    with pytest.raises(SchemaError, match="no type"):
        structural_schema(Untyped)
