"""Evidence for bench_failover.py: what the cluster did around a slow trial, on one wall-clock timeline.

While the bench runs, kubectl watches record (with the time each line arrived) the cluster's pods (role
label, readiness, container state, restarts), Patroni's leader and sync ConfigMaps and the `-rw`
EndpointSlices. For a trial whose outage passes a threshold, `Watch.dump` writes one directory: those
lines, both writers' failed attempts and outages, every instance's log (the killed container's previous
one too), the operators' logs and the node's kubelet and kube-proxy logs, cut to the trial's window
and merged into `timeline.txt`, plus each source on its own.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.deployed_operator import OPERATOR_NAMESPACE
from harness.local_cluster import Kube
from harness.pgcluster import Writer

POD_FIELDS = (
    "{.metadata.name} rv={.metadata.resourceVersion} role={.metadata.labels.role} "
    'ready={.status.conditions[?(@.type=="Ready")].status} '
    "started={.status.containerStatuses[0].started} restarts={.status.containerStatuses[0].restartCount} "
    'state={.status.containerStatuses[0].state} deleting={.metadata.deletionTimestamp}{"\\n"}'
)
CONFIGMAP_FIELDS = '{.metadata.name} rv={.metadata.resourceVersion} {.metadata.annotations}{"\\n"}'
SLICE_FIELDS = (
    "{.metadata.name} rv={.metadata.resourceVersion} "
    "{range .endpoints[*]}[{.targetRef.name} {.addresses[0]} ready={.conditions.ready} "
    'serving={.conditions.serving} terminating={.conditions.terminating}]{end}{"\\n"}'
)
KLOG_TIME = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}\.\d+)")


class Watch:
    """kubectl watches of one cluster's pods, Patroni ConfigMaps and -rw EndpointSlices, kept running
    (restarted when the API server ends a watch) until `stop`."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.lines: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen[str]] = []
        watches = {
            "pod": ["pods", "-l", f"db.example.com/cluster={name}", "-o", f"jsonpath={POD_FIELDS}"],
            "cm": [
                "configmaps",
                "--field-selector",
                f"metadata.name={name}-leader",
                "-o",
                f"jsonpath={CONFIGMAP_FIELDS}",
            ],
            "sync": [
                "configmaps",
                "--field-selector",
                f"metadata.name={name}-sync",
                "-o",
                f"jsonpath={CONFIGMAP_FIELDS}",
            ],
            "slice": [
                "endpointslices",
                "-l",
                f"kubernetes.io/service-name={name}-rw",
                "-o",
                f"jsonpath={SLICE_FIELDS}",
            ],
        }
        self._threads = [
            threading.Thread(target=self._follow, args=(tag, args), daemon=True)
            for tag, args in watches.items()
        ]
        for t in self._threads:
            t.start()

    def _follow(self, tag: str, args: Sequence[str]) -> None:
        cmd = [
            str(self.kube.ctx.bin / "kubectl"),
            "--kubeconfig",
            self.kube.kubeconfig,
            "-n",
            self.namespace,
            "get",
            *args,
            "--watch",
        ]
        while not self._stop.is_set():
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            with self._lock:
                self._procs.append(proc)
            assert proc.stdout is not None
            for line in proc.stdout:
                with self._lock:
                    self.lines.append((time.time(), tag, line.rstrip("\n")))
            proc.wait()
            self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for proc in self._procs:
                if proc.poll() is None:
                    proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        with self._lock:
            return [line for line in self.lines if start <= line[0] <= end]

    def dump(
        self,
        directory: Path,
        start: float,
        end: float,
        writers: dict[str, Writer],
        killed: str,
        summary: dict[str, Any],
    ) -> None:
        """Write the evidence of one trial: sources cut to [start, end] (wall clock) and merged."""
        directory.mkdir(parents=True, exist_ok=True)
        merged: list[tuple[float, str, str]] = list(self.between(start, end))
        for label, w in writers.items():
            merged += [(t, f"writer:{label}", msg) for t, msg in w.timeline if start <= t <= end]
            for a, b in w.spans:  # each span's two ends, each at its own time
                merged += [
                    (t, f"writer:{label}", msg)
                    for t, msg in (
                        (a, f"OUTAGE begins (last commit acknowledged before {b - a:.2f} s without one)"),
                        (b, f"OUTAGE of {b - a:.2f} s ends (a commit acknowledged)"),
                    )
                    if start <= t <= end
                ]
        pods = self._pods()
        logs: dict[str, str] = {}
        for pod in pods:
            logs[f"pod-{pod}"] = self._kubectl_logs("-n", self.namespace, pod)
        logs[f"pod-{killed}-previous"] = self._kubectl_logs("-n", self.namespace, killed, "--previous")
        logs["operator"] = self._kubectl_logs(
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=pg-operator",
            "--prefix",
            "--tail=-1",
            "--max-log-requests=4",
        )
        for tag, text in logs.items():
            cut = list(_stamped_lines(text, start, end))
            (directory / f"{tag}.log").write_text("".join(f"{_iso(t)} {line}\n" for t, line in cut))
            merged += [(t, tag, line) for t, line in cut]
        for component in ("kubelet", "kube-proxy"):
            path = self.kube.ctx.logs / f"{component}.log"
            cut = list(_klog_lines(path, start, end)) if path.exists() else []
            (directory / f"{component}.log").write_text("".join(f"{_iso(t)} {line}\n" for t, line in cut))
            # The kubelet logs much that has nothing to do with these pods; the timeline keeps what does.
            merged += [
                (t, component, line)
                for t, line in cut
                if component != "kubelet" or any(p in line for p in (*pods, killed))
            ]
        merged.sort(key=lambda item: item[0])
        (directory / "timeline.txt").write_text(
            "".join(f"{_iso(t)} {tag:>22} {line}\n" for t, tag, line in merged)
        )
        (directory / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    def _pods(self) -> list[str]:
        selector = f"db.example.com/cluster={self.name}"
        res = self.kube.kubectl(
            "get",
            "pods",
            "-n",
            self.namespace,
            "-l",
            selector,
            "-o",
            "jsonpath={.items[*].metadata.name}",
            check=False,
        )
        return str(res.stdout).split()

    def _kubectl_logs(self, *args: str) -> str:
        res = self.kube.kubectl("logs", "--timestamps", *args, check=False, timeout=60)
        return str(res.stdout)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def _stamped_lines(text: str, start: float, end: float) -> Iterable[tuple[float, str]]:
    """kubectl logs --timestamps lines (RFC 3339 first, after a `[pod/…]` prefix with --prefix)."""
    for line in text.splitlines():
        prefix, _, rest = line.partition("] ") if line.startswith("[") else ("", "", line)
        stamp, _, message = rest.partition(" ")
        try:
            t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        if start <= t <= end:
            yield t, f"{prefix}] {message}" if prefix else message


def _klog_lines(path: Path, start: float, end: float) -> Iterable[tuple[float, str]]:
    """Lines of a klog file (`I1203 01:49:53.502255 …`, UTC, no year) within the window."""
    year = dt.datetime.fromtimestamp(start, dt.UTC).year
    size = path.stat().st_size
    with path.open(encoding="utf-8", errors="replace") as f:
        f.seek(max(0, size - 50_000_000))  # the window is recent; skip the bulk of a long log
        for line in f:
            m = KLOG_TIME.match(line)
            if not m:
                continue
            month, day, hour, minute, second = m.groups()
            t = dt.datetime(year, int(month), int(day), int(hour), int(minute), tzinfo=dt.UTC).timestamp()
            t += float(second)
            if start <= t <= end:
                yield t, line.rstrip("\n")
