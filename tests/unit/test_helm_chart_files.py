"""charts/pg-operator holds copies of what deploy/ generates or ships (a packaged chart cannot read
outside its directory): the CRDs, byte for byte, and the alert rules; its appVersion is the operator
image's tag; its README's values table lists every value. What needs the helm binary (rendering, lint,
installs) is in tests/integration/test_helm_chart.py."""

from __future__ import annotations

import re
from typing import Any

import yaml

from harness.paths import REPO

CHART = REPO / "charts" / "pg-operator"
DEPLOY = REPO / "deploy"
COPY_HINT = "copy it again: cp {src} {dst}"
CRD_HINT = "regenerate both with `make manifests`"


def deploy_image() -> str:
    for doc in yaml.safe_load_all((DEPLOY / "operator" / "deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
            return str(next(c["image"] for c in containers if c["name"] == "operator"))
    raise AssertionError("deploy/operator/deployment.yaml has no Deployment")


def test_the_chart_crds_are_the_generated_ones_byte_for_byte() -> None:
    generated = sorted(p.name for p in (DEPLOY / "crd").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == generated
    for name in generated:
        src, dst = DEPLOY / "crd" / name, CHART / "crds" / name
        assert dst.read_bytes() == src.read_bytes(), CRD_HINT


def test_the_chart_alert_rules_are_deploys() -> None:
    src = DEPLOY / "monitoring" / "prometheus-rules.yaml"
    dst = CHART / "files" / "prometheus-rules.yaml"
    assert dst.read_bytes() == src.read_bytes(), COPY_HINT.format(src=src, dst=dst)


def test_app_version_and_default_image_are_deploys() -> None:
    repository, _, tag = deploy_image().rpartition(":")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == tag, "Chart.yaml appVersion must be the image tag of deploy/"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == repository
    assert values["image"]["tag"] == "", "an empty tag means appVersion: one place to bump"


def leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the values a user sets: nested maps are walked, except those whose default is a
    free-form Kubernetes object (resources, security contexts, affinity), which are one value each."""
    free_form = {"resources", "podSecurityContext", "securityContext", "affinity"}
    keys = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in free_form:
            keys |= leaf_keys(value, f"{path}.")
        else:
            keys.add(path)
    return keys


def test_the_readme_values_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    table = set(re.findall(r"^\| `([A-Za-z0-9.]+)` \|", readme, re.MULTILINE))
    assert table == leaf_keys(values)


def test_values_yaml_documents_every_value() -> None:
    """The line setting each value (as the README's table counts them) has a comment right above it."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    wanted = leaf_keys(values)
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing maps
    documented, previous = set(), ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k in stack] + [match.group(2)])
            if path in wanted and previous.lstrip().startswith("#"):
                documented.add(path)
            stack.append((indent, match.group(2)))
        if line.strip():
            previous = line
    assert wanted - documented == set()
