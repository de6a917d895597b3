"""Fencing inside the pod: while instance.yaml lists this instance (its `fenced` list, by name or `*`), the
entrypoint runs no Patroni and so no PostgreSQL, and keeps the container alive for inspection.

- Becoming fenced: Patroni is stopped with SIGTERM, which stops PostgreSQL cleanly (a fast shutdown: one
  checkpoint; the data directory is left as a clean shutdown leaves it). The operator hands a primary over
  first (controller/reconcilers/lifecycle.py).
- While fenced: Patroni's port answers the kubelet's probes itself: /liveness 200 (the kubelet must not
  restart the container), /readiness 503 (the pod leaves its Services), anything else 503. The pod's
  annotation POSTGRES_STOPPED_ANNOTATION says since when PostgreSQL is stopped: the operator's signal that
  the stop is done.
- Unfenced: the annotation is removed and Patroni starts again; it rejoins as Patroni does after any stop
  (pg_rewind when its timeline diverged).

A pod that starts fenced (a restart, a wake from hibernation) never starts Patroni.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import yaml

from pg_operator import tls_server
from pg_operator.api.constants import PATRONI_PORT, POSTGRES_STOPPED_ANNOTATION
from pg_operator.instance.inputs import PodEnvironment, tls_files

FENCE_ALL = "*"
REPORT_RETRY_SECONDS = 2.0
_TEXT = "text/plain; charset=utf-8"
LIVE = tls_server.Response(200, _TEXT, b"fenced: the container runs, PostgreSQL is stopped\n")
NOT_READY = tls_server.Response(503, _TEXT, b"fenced: PostgreSQL is stopped\n")


def _log(message: str) -> None:
    print(f"fencing: {message}", file=sys.stderr, flush=True)


def listed(pod_name: str, fenced: object) -> bool:
    """Whether instance.yaml's `fenced` value names this instance."""
    return isinstance(fenced, list) and (pod_name in fenced or FENCE_ALL in fenced)


def fenced_in(config_file: str, pod_name: str) -> bool | None:
    """Whether the mounted instance.yaml fences this instance; None when it cannot be read now (the kubelet
    swapping the file): the caller keeps what it had."""
    try:
        data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, Mapping):
        return None
    return listed(pod_name, data.get("fenced"))


def probe_answer(path: str) -> tls_server.Response:
    return LIVE if path.split("?")[0] == "/liveness" else NOT_READY


class ProbeServer(tls_server.BoundedHttpsServer):
    """Patroni's port while Patroni does not run: the kubelet's HTTPS probes (it does not verify the
    certificate, but speaks TLS), answered with the pod's server certificate."""

    def __init__(self, address: tuple[str, int], cert: str, key: str) -> None:
        self._cert, self._key = cert, key
        super().__init__(address, probe_answer, self._context)

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert, self._key)
        return context


class StoppedReport:
    """The pod annotation saying since when PostgreSQL is stopped (absent while it may run), patched from a
    thread that retries until the API server took it; nothing outside a pod."""

    def __init__(self, pod: PodEnvironment, env: Mapping[str, str]) -> None:
        self._want: str | None = None
        self._sent: str | bool | None = False  # False: nothing sent yet
        self._wake = threading.Event()
        self._patcher = None
        if env.get("KUBERNETES_SERVICE_HOST"):
            from pg_operator.instance.archive_reporter import PodPatcher

            self._patcher = PodPatcher(pod.namespace, pod.pod_name)
            threading.Thread(target=self._run, name="fencing-report", daemon=True).start()

    def set(self, stopped: bool) -> None:
        self._want = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if stopped else None
        self._wake.set()

    def _run(self) -> None:
        assert self._patcher is not None
        failed = ""
        while True:
            self._wake.wait(REPORT_RETRY_SECONDS)
            self._wake.clear()
            want = self._want
            if want == self._sent:
                continue
            try:
                self._patcher.patch({"metadata": {"annotations": {POSTGRES_STOPPED_ANNOTATION: want}}})
            except OSError as e:
                if str(e) != failed:
                    _log(f"cannot publish the fencing state on the pod (retrying): {e}")
                failed = str(e)
                continue
            self._sent, failed = want, ""


class Fence:
    """This instance's fencing as the entrypoint's loop follows it."""

    def __init__(self, pod: PodEnvironment, env: Mapping[str, str], port: int = PATRONI_PORT) -> None:
        self.pod = pod
        self.port = port  # Patroni's REST API port (instance.yaml), which the probes ask
        self.report = StoppedReport(pod, env)
        self.wanted = bool(fenced_in(pod.config_file, pod.pod_name))
        self.stopping = False  # Patroni was sent SIGTERM to fence the instance
        self._probes: ProbeServer | None = None

    def read(self) -> bool:
        now = fenced_in(self.pod.config_file, self.pod.pod_name)
        if now is not None:
            self.wanted = now
        return self.wanted

    def stopped(self) -> None:
        """Patroni is not running (stopped for fencing, or never started): answer the probes, report."""
        self.stopping = False
        if self._probes is None:
            tls = tls_files(self.pod.run_dir)
            self._probes = ProbeServer((self.pod.listen_host or "0.0.0.0", self.port), tls.cert, tls.key)  # noqa: S104
            self._probes.start("fenced-probes")
        self.report.set(stopped=True)
        _log(f"{self.pod.pod_name} is fenced: PostgreSQL stays stopped, the pod keeps running")

    def unfenced(self) -> None:
        """About to start Patroni: free its port, withdraw the report."""
        self.close()
        self.report.set(stopped=False)

    def close(self) -> None:
        if self._probes is not None:
            self._probes.shutdown()
            self._probes.server_close()
            self._probes = None


def stop_leftover_postgres(pod: PodEnvironment) -> None:
    """After Patroni exited to fence the instance: PostgreSQL must be stopped too. Patroni leaves it running
    when its cluster is paused (maintenance mode); then stop it here, cleanly."""
    if not Path(pod.pgdata, "postmaster.pid").exists():
        return
    pg_ctl = str(Path(pod.pg_bin_dir, "pg_ctl"))
    done = subprocess.run([pg_ctl, "stop", "-D", pod.pgdata, "-m", "fast", "-w", "-t", "600"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    _log(f"pg_ctl stop: {(done.stdout + done.stderr).strip() or done.returncode}")
