"""What an e2e failure leaves behind for whoever reads only the test output (CI shows nothing else):
every PostgresCluster's phase, conditions and instances, the pods that are not plainly running (and why,
where the scheduler said), what the pods request of the node, recent Warning Events, the tail of the
operator's log and of each PostgreSQL pod that is not ready or restarted.
Secrets are never read."""

from __future__ import annotations

import json
from typing import Any

from harness.deployed_operator import OPERATOR_NAMESPACE
from harness.local_cluster import Kube

LOG_LINES = 80
POD_LINES = 40
EVENTS = 25


def _json(kube: Kube, *args: str) -> dict[str, Any]:
    res = kube.kubectl(*args, "-o", "json", check=False, timeout=30)
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout else {"items": []}


def clusters(kube: Kube) -> list[str]:
    lines = []
    for item in _json(kube, "get", "pgc", "-A")["items"]:
        meta, st = item["metadata"], item.get("status") or {}
        lines.append(f"pgc {meta['namespace']}/{meta['name']}: phase={st.get('phase')!r} "
                     f"primary={st.get('currentPrimary')!r}")  # fmt: skip
        for c in st.get("conditions") or []:
            message = str(c.get("message", ""))[:300]
            lines.append(f"  {c.get('type')}={c.get('status')} {c.get('reason')}: {message}")
        for i in st.get("instances") or []:
            rest = {k: v for k, v in i.items() if k not in ("name", "role", "ready")}
            lines.append(f"  instance {i.get('name')}: role={i.get('role')} ready={i.get('ready')} {rest}")
    return lines


def pods(kube: Kube) -> list[str]:
    lines = []
    for pod in _json(kube, "get", "pods", "-A")["items"]:
        meta, st = pod["metadata"], pod.get("status") or {}
        states = [(c["name"], c.get("ready"), c.get("restartCount"), next(iter(c.get("state") or {}), "?"))
                  for c in st.get("containerStatuses") or []]  # fmt: skip
        if (
            st.get("phase") == "Running"
            and all(ready for _, ready, _, _ in states)
            and not meta.get("deletionTimestamp")
        ):
            continue
        lines.append(f"pod {meta['namespace']}/{meta['name']}: {st.get('phase')} "
                     f"deleting={bool(meta.get('deletionTimestamp'))} {states}")  # fmt: skip
        lines += [f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                  for c in st.get("conditions") or [] if c.get("status") != "True"]  # fmt: skip
    return lines


def node_requests(kube: Kube) -> list[str]:
    """What the pods request of each node against what it has: a full node leaves pods Pending."""
    lines = []
    for node in _json(kube, "get", "nodes")["items"]:
        res = kube.kubectl("describe", "node", node["metadata"]["name"], check=False, timeout=30)
        text = res.stdout or ""
        start = text.find("Allocated resources:")
        if start >= 0:
            block = text[start:].splitlines()[:8]
            lines += [f"node {node['metadata']['name']}: {line.strip()}" for line in block if line.strip()]
    return lines


def instance_logs(kube: Kube) -> list[str]:
    """The log tail of each PostgreSQL pod that is not ready or has restarted (and of its previous
    container when it restarted): what Patroni and PostgreSQL said about the failure."""
    lines = []
    for pod in _json(kube, "get", "pods", "-A", "-l", "db.example.com/cluster")["items"]:
        meta = pod["metadata"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        restarted = any(c.get("restartCount") for c in statuses)
        if all(c.get("ready") for c in statuses) and statuses and not restarted:
            continue
        for previous in (True, False) if restarted else (False,):
            args = ["logs", meta["name"], "-n", meta["namespace"], "-c", "postgres", f"--tail={POD_LINES}"]
            res = kube.kubectl(*args, *(["--previous"] if previous else []), check=False, timeout=30)
            tag = f"{meta['namespace']}/{meta['name']}{' (previous)' if previous else ''}"
            lines += [f"log {tag}: {line}" for line in (res.stdout or res.stderr).splitlines()]
    return lines


def warnings(kube: Kube) -> list[str]:
    items = [e for e in _json(kube, "get", "events", "-A")["items"] if e.get("type") == "Warning"]
    items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"event {e['metadata']['namespace']} {e.get('lastTimestamp') or e.get('eventTime')} "
            f"{e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message', '')[:300]}"
            for e in items[-EVENTS:]]  # fmt: skip


def operator_log(kube: Kube) -> list[str]:
    res = kube.kubectl("-n", OPERATOR_NAMESPACE, "logs", "deployment/pg-operator", f"--tail={LOG_LINES}",
                       check=False, timeout=30)  # fmt: skip
    return [f"operator: {line}" for line in (res.stdout or res.stderr).splitlines()]


def report(kube: Kube) -> str:
    """The whole picture as text; a part that cannot be read says so instead of hiding the rest."""
    parts = []
    for part in (clusters, pods, node_requests, warnings, operator_log, instance_logs):
        try:
            parts.extend(part(kube))
        except Exception as exc:  # a report must not replace the failure it explains
            parts.append(f"{part.__name__}: could not be read: {exc}")
    return "\n".join(parts)
