"""A real Prometheus (Debian's package, /usr/bin/prometheus) on this host's loopback for the monitoring
tests: it scrapes the local cluster's pods with deploy/monitoring/prometheus-scrape.yaml and evaluates
deploy/monitoring's rules. Debian builds Prometheus without Kubernetes service discovery, so this
harness lists the pods itself and hands Prometheus the targets that discovery would (file_sd with the
same __meta_kubernetes_* labels): the shipped relabeling is applied by Prometheus as it is.

The test's copy of the rule file differs in one way only: every `for:` is shortened (`short_for`) so an
alert fires seconds after its condition holds; expressions and thresholds are the shipped ones. Scrapes
and evaluations run every 2 s."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.net import free_port, http_get
from harness.paths import REPO
from harness.processes import stop_process
from harness.waiting import wait_until

MONITORING = REPO / "deploy" / "monitoring"
INTERVAL = "2s"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    assert path, "prometheus is missing: apt-get install prometheus (make test installs it)"
    return path


def rules_with_short_for(short_for: str) -> dict[str, Any]:
    """The shipped rule file with each `for:` replaced by `short_for`."""
    doc = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = short_for
    return dict(doc)


TARGETS_FILE = "targets.json"


def scrape_config(namespaces: Mapping[str, list[str]], tls: Mapping[str, Any]) -> dict[str, Any]:
    """prometheus-scrape.yaml for Debian's Prometheus, which is built without Kubernetes service
    discovery: each job's kubernetes_sd_configs becomes a file_sd_config of the targets that discovery
    would give (`discovered_targets`, with the same __meta_kubernetes_* labels), so Prometheus applies
    the shipped relabel_configs unchanged. The instances' job's tls_config is replaced by `tls` (to
    verify); `namespaces` says which namespaces each job (by name) discovers, as the SD's own option."""
    jobs = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())["scrape_configs"]
    for job in jobs:
        assert [sd["role"] for sd in job.pop("kubernetes_sd_configs")] == ["pod"], job["job_name"]
        job["file_sd_configs"] = [{"files": [f"{job['job_name']}-{TARGETS_FILE}"], "refresh_interval": "5s"}]
        if job["job_name"] == "pg-operator-instances":
            job["tls_config"] = dict(tls)
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": ["rules.yaml"],
        "scrape_configs": jobs,
        "namespaces": dict(namespaces),  # read (and removed) by prometheus() for discovery
    }


def _label_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def discovered_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Kubernetes SD (role: pod) gives for these pods: one target per declared container port, with
    the __meta_kubernetes_* labels the shipped relabel_configs read."""
    out = []
    for pod in pods:
        meta, ip = pod["metadata"], (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        labels = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
            **{
                f"__meta_kubernetes_pod_label_{_label_name(k)}": v
                for k, v in (meta.get("labels") or {}).items()
            },
        }
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or ():
                target_labels = {
                    **labels,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                }
                out.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": target_labels})
    return out


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        code, body = http_get(f"{self.url}{path}{query}", timeout=10)
        assert code == 200, f"GET {path}{query}: {code} {body[:500]}"
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (a scalar comes back as one sample without labels)."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", state="active")["activeTargets"])

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, str]]:
        """The labels of each alert `name` in `state` (pending, firing)."""
        return [a["labels"] for a in self._get("/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]  # fmt: skip

    def wait_firing(self, name: str, timeout: float, **labels: str) -> dict[str, str]:
        def firing() -> dict[str, str] | None:
            return next((a for a in self.alerts(name) if labels.items() <= a.items()), None)

        return dict(wait_until(f"alert {name}{labels or ''} to fire", firing, timeout, 2))

    def wait_resolved(self, name: str, timeout: float, **labels: str) -> None:
        def gone() -> bool:
            return not any(
                labels.items() <= a.items()
                for a in self.alerts(name, "firing") + self.alerts(name, "pending")
            )

        wait_until(f"alert {name}{labels or ''} to resolve", gone, timeout, 2)


@contextlib.contextmanager
def prometheus(
    workdir: Path,
    config: Mapping[str, Any],
    rules: Mapping[str, Any],
    list_pods: Callable[[str], list[dict[str, Any]]],
) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port with `config` (from scrape_config) and `rules`, checked by
    promtool first, data in `workdir`. A thread re-lists the pods of each job's namespaces every 2 s
    (`list_pods(namespace)`) and rewrites the job's targets file when it changed, as discovery would.
    Stopped (its data left for the post-mortem) on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    namespaces: dict[str, list[str]] = config.pop("namespaces")
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (workdir / "rules.yaml").write_text(yaml.safe_dump(dict(rules), sort_keys=False))

    def discover() -> None:
        for job, names in namespaces.items():
            text = json.dumps(discovered_targets([p for ns in names for p in list_pods(ns)]), indent=1)
            path = workdir / f"{job}-{TARGETS_FILE}"
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)

    discover()
    promtool = shutil.which("promtool") or "promtool"
    check = subprocess.run([promtool, "check", "config", str(workdir / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1d", "--log.level=warn"],
            stdout=out, stderr=out, cwd=workdir,
        )  # fmt: skip
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    stop = threading.Event()

    def keep_discovering() -> None:
        while not stop.wait(2):
            with contextlib.suppress(Exception):  # a failed listing keeps the last targets, as SD does
                discover()

    thread = threading.Thread(target=keep_discovering, name="discovery", daemon=True)
    thread.start()
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}"
            return http_get(f"{server.url}/-/ready", timeout=2)[0] == 200

        wait_until("prometheus to be ready", ready, 60, 0.5)
        yield server
    finally:
        stop.set()
        thread.join(10)
        stop_process(proc)
