"""`kubectl pgc status`: one screen of a cluster, from the status the operator writes
(api/cluster_status.py) and the instance pods: instances with role, readiness, timeline, lag and pending
restarts, WAL archiving and the last backup with their ages, open requests, conditions, and why a pod
cannot run (orchestration/stuck_pods.py, read from the pods themselves: shown even while the Degraded
condition names another problem).

`summarize` and `render` are pure (plain dicts in, a dict or text out); `run` fetches and prints."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import CONTAINER_NAME
from pg_operator.backup.archive_health import archiving_summary
from pg_operator.backup.archive_report import parse_report
from pg_operator.cli.pgc.connection import Connection, cluster_pods, get_cluster
from pg_operator.cli.pgc.errors import NOT_READY, OK
from pg_operator.cli.pgc.requests import SWITCHOVER_ANNOTATION
from pg_operator.orchestration.requested_restart import RESTART_ANNOTATION
from pg_operator.orchestration.stuck_pods import stuck_pods


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def age_seconds(value: Any, now: datetime) -> int | None:
    when = parse_time(value)
    return None if when is None else max(int((now - when).total_seconds()), 0)


def human_age(seconds: int | None) -> str:
    """kubectl's style: 42s, 5m10s, 3h12m, 4d5h; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds < 600 else f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def human_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value}{unit}"
        value //= 1024
    return f"{value}TiB"


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in objects.status(pod).get("containerStatuses") or []:
        if c.get("name") == CONTAINER_NAME:
            return dict(c)
    return {}


# What `requests` shows: the requests the operator has not answered yet.
REQUESTS = (("switchoverTo", SWITCHOVER_ANNOTATION), ("restartRequested", RESTART_ANNOTATION))
REQUEST_TEXT = {
    "switchoverTo": "switchover to {} requested",
    "restartRequested": "rolling restart requested at {}",
}
INSTANCE_COLUMNS = (
    "INSTANCE",
    "ROLE",
    "READY",
    "TIMELINE",
    "LAG",
    "PENDING RESTART",
    "NODE",
    "RESTARTS",
    "AGE",
)


def summarize(cluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """Everything `status` shows, as one JSON-ready dict (also what `-o json` prints)."""
    st = objects.status(cluster)
    spec = objects.spec(cluster)
    by_pod = {objects.name(p): p for p in pods}
    instances = []
    reported = {str(i.get("name")): i for i in st.get("instances") or []}
    for name in sorted(set(reported) | set(by_pod)):
        inst, pod = reported.get(name) or {}, by_pod.get(name) or {}
        container = _container_status(pod)
        instances.append(
            {
                "name": name,
                "role": inst.get("role") or objects.label(pod, "role") or "unknown",
                "ready": bool(inst.get("ready"))
                if inst
                else objects.condition_status(objects.status(pod), "Ready") == "True",
                "timeline": inst.get("timeline"),
                "lagBytes": inst.get("lagBytes"),
                "pendingRestart": list(inst.get("pendingRestart") or []),
                "node": objects.spec(pod).get("nodeName") or "",
                "restarts": int(container.get("restartCount") or 0) if pod else None,
                "ageSeconds": age_seconds(objects.meta(pod).get("creationTimestamp"), now) if pod else None,
                "podExists": bool(pod),
            }
        )
    backup = st.get("backup") or {}
    archiving = backup.get("archiving") or {}
    # The primary's own report is live; the status keeps archiving's state as of its last change.
    primary_pod = by_pod.get(str(st.get("currentPrimary") or ""))
    report = parse_report(objects.meta(primary_pod).get("annotations")) if primary_pod else None
    if report is not None and backup:
        archiving = archiving_summary(report.stats, objects.name(primary_pod))
    requests = {}
    for key, annotation in REQUESTS:
        if objects.annotation(cluster, annotation):
            requests[key] = objects.annotation(cluster, annotation)
    conditions = [
        {
            "type": c.get("type"),
            "status": c.get("status"),
            "reason": c.get("reason") or "",
            "message": c.get("message") or "",
            "ageSeconds": age_seconds(c.get("lastTransitionTime"), now),
        }
        for c in st.get("conditions") or []
    ]
    return {
        "name": objects.name(cluster),
        "namespace": objects.namespace(cluster),
        "phase": st.get("phase") or "",
        "ready": objects.condition_status(st, "Ready") == "True",
        "version": str(spec.get("version") or ""),
        "replicas": spec.get("replicas"),
        "readyReplicas": st.get("readyReplicas", 0),
        "primary": st.get("currentPrimary") or "",
        "stale": objects.generation(cluster) != int(st.get("observedGeneration") or 0),
        "instances": instances,
        "archiving": None
        if not backup
        else {
            "lastArchivedWAL": archiving.get("lastArchivedWAL"),
            "lastArchivedAgeSeconds": age_seconds(archiving.get("lastArchivedTime"), now),
            "pendingWAL": archiving.get("pendingWAL"),
            "lastFailedWAL": archiving.get("lastFailedWAL"),
            "lastFailedAgeSeconds": age_seconds(archiving.get("lastFailedTime"), now),
        },
        "lastBackup": None
        if not backup.get("lastSuccessfulBackup")
        else {
            "name": backup.get("lastSuccessfulBackup"),
            "ageSeconds": age_seconds(backup.get("lastSuccessfulBackupTime"), now),
        },
        "requests": requests,
        # The claims are not read here: a pod waiting for its volume shows as the scheduler words it.
        "stuck": [
            {"pod": s.pod, "container": s.container, "reason": s.reason.value, "message": s.message}
            for s in stuck_pods(pods, (), now)
        ],
        "conditions": conditions,
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]


def render(s: Mapping[str, Any]) -> str:
    stale = "   (status not yet for the latest spec)" if s["stale"] else ""
    lines = [
        f"Cluster    {s['namespace']}/{s['name']}   PostgreSQL {s['version']}   "
        f"{s['phase'] or 'no status yet'}{stale}"
    ]
    lines.append(f"Primary    {s['primary'] or 'NONE'}   ready {s['readyReplicas']}/{s['replicas']}")
    arch = s.get("archiving")
    if arch is None:
        lines.append("Archiving  not configured (no spec.backup)")
    else:
        failed = (
            f"   last failure {arch['lastFailedWAL']} {human_age(arch['lastFailedAgeSeconds'])} ago"
            if arch.get("lastFailedWAL")
            else ""
        )
        last = (
            f"{arch['lastArchivedWAL']} {human_age(arch['lastArchivedAgeSeconds'])} ago"
            if arch.get("lastArchivedWAL")
            else "nothing archived yet"
        )
        pending = f"   pending {arch['pendingWAL']}" if arch.get("pendingWAL") is not None else ""
        lines.append(f"Archiving  last {last}{pending}{failed}")
        b = s.get("lastBackup")
        lines.append(
            f"Backup     {b['name']} {human_age(b['ageSeconds'])} ago" if b else "Backup     none completed"
        )
    for key, value in s["requests"].items():
        lines.append("Request    " + REQUEST_TEXT[key].format(value))
    lines.append("")
    rows = [
        [
            i["name"],
            i["role"],
            "yes" if i["ready"] else "NO",
            str(i["timeline"] or "-"),
            "-" if i["role"] == "primary" else human_bytes(i["lagBytes"]),
            ",".join(i["pendingRestart"]) or "-",
            i["node"] or "-",
            "-" if i["restarts"] is None else str(i["restarts"]),
            human_age(i["ageSeconds"]) if i["podExists"] else "no pod",
        ]
        for i in s["instances"]
    ]
    lines += _table(INSTANCE_COLUMNS, rows)
    for stuck in s.get("stuck") or ():
        lines.append(f"Stuck      {stuck['reason']}: {stuck['message']}")
    if s["conditions"]:
        lines.append("")
        lines += _table(
            ["CONDITION", "STATUS", "REASON", "AGE", "MESSAGE"],
            [
                [c["type"], c["status"], c["reason"], human_age(c["ageSeconds"]), c["message"]]
                for c in s["conditions"]
            ],
        )
    return "\n".join(lines)


def run(conn: Connection, name: str, output: str) -> int:
    cluster = get_cluster(conn, name)
    summary = summarize(cluster, cluster_pods(conn, name), datetime.now(UTC))
    print(json.dumps(summary, indent=2) if output == "json" else render(summary))
    return OK if summary["ready"] else NOT_READY
