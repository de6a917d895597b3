"""deploy/monitoring/: the rules pass promtool's own check and unit tests (deploy/monitoring/tests/), the
PrometheusRule holds exactly the plain rule file's groups, every alert has a severity, a `for:` and a
runbook section in docs/monitoring.md, and the scrape objects name the ports the pods and the operator
really have."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pg_operator.api.constants import METRICS_PORT, METRICS_PORT_NAME

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "monitoring"


def load(name: str) -> Any:
    return yaml.safe_load((MONITORING / name).read_text())


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: apt-get install prometheus (make test installs it)"
    return path


def alerts() -> list[dict[str, Any]]:
    return [r for g in load("prometheus-rules.yaml")["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    res = subprocess.run([promtool(), "check", "rules", str(MONITORING / "prometheus-rules.yaml")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    res = subprocess.run([promtool(), "test", "rules", "rules-test.yaml"], cwd=MONITORING / "tests",
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load((MONITORING / "tests" / "rules-test.yaml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    assert sorted({a["alert"] for a in alerts()} - fired) == []


def test_prometheus_rule_holds_the_plain_rule_files_groups() -> None:
    rule = load("prometheus-rule.yaml")
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == load("prometheus-rules.yaml")["groups"]


def test_each_alert_has_severity_for_and_a_runbook_section() -> None:
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    headings = {line.lstrip("#").strip().lower() for line in doc.splitlines() if line.startswith("### ")}
    problems = []
    for a in alerts():
        name = a["alert"]
        if a["labels"].get("severity") not in {"warning", "critical"}:
            problems.append(f"{name}: severity")
        if not a.get("for"):
            problems.append(f"{name}: no for")
        anchor = a["annotations"]["runbook"].split("#", 1)[1]
        if anchor not in headings:
            problems.append(f"{name}: no '### {anchor}' section in docs/monitoring.md")
    assert problems == []


def test_pod_monitor_scrapes_the_instance_port() -> None:
    from harness.objects import cluster_model
    from pg_operator.specs.statefulset import statefulset

    pm = load("podmonitor.yaml")
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == METRICS_PORT_NAME and endpoint["scheme"] == "https"
    template = statefulset(cluster_model())["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"} in container["ports"]
    labels = template["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert targets == {"cluster", "node"}


def test_service_monitor_reaches_the_operators_metrics_port() -> None:
    deployment = next(d for d in yaml.safe_load_all((ROOT / "deploy/operator/deployment.yaml").read_text())
                      if d and d["kind"] == "Deployment")  # fmt: skip
    pod = deployment["spec"]["template"]
    (operator,) = [c for c in pod["spec"]["containers"] if c["name"] == "operator"]
    port = next(p for p in operator["ports"] if p["name"] == "metrics")
    assert f"--metrics-port={port['containerPort']}" in operator["args"]
    service = load("operator-metrics-service.yaml")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    sm = load("servicemonitor.yaml")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_kustomization_lists_the_prometheus_operator_objects() -> None:
    listed = set(load("kustomization.yaml")["resources"])
    assert listed == {"operator-metrics-service.yaml", "servicemonitor.yaml", "podmonitor.yaml",
                      "prometheus-rule.yaml"}  # fmt: skip
    for name in listed:
        assert (MONITORING / name).is_file()


def test_plain_scrape_config_labels_series_as_the_pod_monitor_does() -> None:
    jobs = {j["job_name"]: j for j in load("prometheus-scrape.yaml")["scrape_configs"]}
    instances = jobs["pg-operator-instances"]
    assert instances["scheme"] == "https"
    targets = {r.get("target_label") for r in instances["relabel_configs"]} - {None}
    assert targets == {"namespace", "pod", "cluster", "node", "endpoint"}
    keep = instances["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"].endswith(f";{METRICS_PORT_NAME}")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads((MONITORING / "dashboard.json").read_text()))


def test_dashboard_panels_have_ids_queries_and_the_variables(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    queries = [p for p in panels if p["type"] != "row"]
    assert queries and all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in queries)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "cluster"}
    rows = {p["title"] for p in panels if p["type"] == "row"}
    for topic in ("Health", "Replication", "Throughput", "Archiving and backups", "Storage"):
        assert topic in rows
