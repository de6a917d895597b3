"""Helpers for e2e tests of real PostgreSQL clusters (full profile): Secrets, Services, connections,
health, container kills, network partitions and a writing client."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from localkube import node
from psycopg import sql

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.waiting import wait_until


def secret(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    data = get_json(kube, "secret", name, "-n", namespace)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def service_ip(kube: Kube, namespace: str, name: str) -> str:
    return str(get_json(kube, "service", name, "-n", namespace)["spec"]["clusterIP"])


def connect_app(
    kube: Kube, namespace: str, cluster: str, service_suffix: str = "rw", timeout: int = 3
) -> psycopg.Connection[Any]:
    app = secret(kube, namespace, f"{cluster}-app")
    return psycopg.connect(
        host=service_ip(kube, namespace, f"{cluster}-{service_suffix}"),
        port=int(app["port"]),
        user=app["username"],
        password=app["password"],
        dbname=app["dbname"],
        connect_timeout=timeout,
        autocommit=True,
    )


def status(kube: Kube, namespace: str, cluster: str) -> dict[str, Any]:
    return dict(get_json(kube, "pgc", cluster, "-n", namespace).get("status") or {})


class Unschedulable(RuntimeError):
    """A pod the scheduler has refused for minutes: waiting longer cannot help, so a wait fails at once
    (not in waiting.NOT_YET) and names the scheduler's reason, usually a node whose CPU or memory the
    session's clusters have requested in full."""


REFUSED = ("PodScheduled", "False", "Unschedulable")
UNSCHEDULABLE_FOR = 180.0  # seconds; volume binding and a just-freed node settle well within this


def unschedulable(kube: Kube, namespace: str, cluster: str, now: float | None = None) -> list[str]:
    """The scheduler's word on each of the cluster's pods it has refused for UNSCHEDULABLE_FOR seconds."""
    now = time.time() if now is None else now
    out = []
    for pod in get_json(kube, "pods", "-n", namespace, "-l", f"db.example.com/cluster={cluster}")["items"]:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if (c.get("type"), c.get("status"), c.get("reason")) != REFUSED:
                continue
            since = dt.datetime.fromisoformat(c["lastTransitionTime"]).timestamp()
            if now - since >= UNSCHEDULABLE_FOR:
                out.append(f"{pod['metadata']['name']}: {c.get('message')}")
    return out


def healthy(kube: Kube, namespace: str, cluster: str, replicas: int) -> dict[str, Any] | None:
    """The status once every instance is ready with exactly one primary, else None; Unschedulable
    when the scheduler has refused one of its pods for minutes."""
    st = status(kube, namespace, cluster)
    instances = st.get("instances") or []
    roles = sorted(i.get("role") for i in instances)
    ok = (
        len(instances) == replicas
        and all(i.get("ready") for i in instances)
        and roles == ["primary"] + ["replica"] * (replicas - 1)
        and st.get("currentPrimary")
    )
    if ok:
        return st
    refused = unschedulable(kube, namespace, cluster)
    if refused:
        raise Unschedulable(f"{namespace}/{cluster}: " + "; ".join(refused))
    return None


def wait_serving(kube: Kube, namespace: str, cluster: str, replicas: int, timeout: float) -> dict[str, Any]:
    """Wait until the operator reports the cluster healthy and the -rw Service routes to the primary.

    Ready is the operator's word; the Service's endpoints and kube-proxy's rules follow moments later,
    and a client connecting in between is refused.
    """
    st: dict[str, Any] = wait_until(
        f"{cluster} to be healthy", lambda: healthy(kube, namespace, cluster, replicas), timeout, 2
    )

    def routes() -> bool:
        connect_app(kube, namespace, cluster).close()
        return True

    wait_until(f"the {cluster}-rw Service to reach the primary", routes, 60)
    return st


# The single test node has 2 CPUs, 2000m to request: the operator (100m), the shared clusters that live
# all session (the example's 3 x 250m as shipped, sync and day2) and each module's own must fit at once,
# or a pod waits for the scheduler forever. 50m each leaves room for a module's six pods.
SMALL = {"requests": {"cpu": "50m", "memory": "512Mi"}}


# The e2e tier's synchronous cluster (its `sync_cluster` fixture), shared by the failover and settings
# modules: three instances, one synchronous standby that must acknowledge every commit.
SYNC_NAMESPACE, SYNC_NAME = "ha-sync", "sync-db"
SYNC_SPEC: dict[str, Any] = {"replicas": 3, "synchronous": {"number": 1, "dataDurability": "required"}}


def serving_cluster(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> Iterator[Kube]:
    """A module fixture's body: a namespace with one PostgresCluster (small requests unless the spec
    says otherwise), yielded once it serves through -rw; the namespace goes afterwards."""
    kube.kubectl("create", "namespace", namespace)
    body = cluster(name, namespace, **{"resources": SMALL, **spec})
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_serving(kube, namespace, name, int(spec["replicas"]), 900)
    yield kube
    kube.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")  # pods go in seconds


def container_pid(kube: Kube, namespace: str, pod: str, container: str = "postgres") -> int:
    """The host pid of a running container's init process, from containerd's task list."""
    pod_obj = get_json(kube, "pod", pod, "-n", namespace)
    cid = next(c["containerID"] for c in pod_obj["status"]["containerStatuses"] if c["name"] == container)
    cid = cid.split("://", 1)[1]
    res = subprocess.run(
        ["ctr", "--address", node.containerd_address(kube.ctx), "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        check=True,
    )
    pids = [line.split()[1] for line in res.stdout.splitlines()[1:] if line.split()[0] == cid]
    assert pids, f"no running task for container {cid} of {pod}"
    return int(pids[0])


def kill_container(kube: Kube, namespace: str, pod: str, container: str = "postgres") -> None:
    """SIGKILL a container's init process from the host, as a crash or the OOM killer would."""
    subprocess.run(["kill", "-9", str(container_pid(kube, namespace, pod, container))], check=True)


def pod_netns(kube: Kube, namespace: str, pod: str) -> str:
    """The path of the pod's network namespace (its sandbox's, shared by its containers, so it outlives
    a container restart): the netns file under /run/netns with the same inode as a container's."""
    inode = os.stat(f"/proc/{container_pid(kube, namespace, pod)}/ns/net").st_ino
    for entry in sorted(Path("/run/netns").iterdir()):
        if entry.stat().st_ino == inode:
            return str(entry)
    raise AssertionError(f"no netns file under /run/netns for pod {pod}")


def _in_netns(netns: str, *cmd: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--net={netns}", *cmd],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        input=input,
    )


class Partition:
    """Cut a pod off the network inside its own namespace: every packet in or out is dropped except on
    loopback and the kubelet's probes from the node (the gateway address) to Patroni's port, so the
    pod keeps running where a real partition would leave it: cut off from its peers, the API server and
    every client."""

    def __init__(self, netns: str, probe_port: int = 8008) -> None:
        self.netns = netns
        route = _in_netns(netns, "ip", "-4", "route", "show", "default").stdout.split()
        gateway = route[route.index("via") + 1]
        self.rules = [
            ["INPUT", "-i", "lo", "-j", "ACCEPT"],
            ["OUTPUT", "-o", "lo", "-j", "ACCEPT"],
            ["INPUT", "-s", gateway, "-p", "tcp", "--dport", str(probe_port), "-j", "ACCEPT"],
            ["OUTPUT", "-d", gateway, "-p", "tcp", "--sport", str(probe_port), "-j", "ACCEPT"],
            ["INPUT", "-j", "DROP"],
            ["OUTPUT", "-j", "DROP"],
        ]

    def cut(self) -> None:
        for rule in self.rules:
            _in_netns(self.netns, "iptables", "-w", "-A", *rule)

    def heal(self) -> None:
        if not Path(self.netns).exists():
            return  # the sandbox went away with its rules (a test checks for that and says so)
        for rule in self.rules:
            _in_netns(self.netns, "iptables", "-w", "-D", *rule)


class StreamHold:
    """Hold back one standby's replication stream: inside the standby's netns, drop what arrives from the
    primary's address and port 5432, so the primary keeps sending (its walsender does not wait for
    acknowledgements) but this standby receives nothing more until `release` (TCP retransmits the rest
    if the primary is still there). With a SIGKILL of the primary in between, the other standby ends
    up with WAL this one never got."""

    def __init__(self, netns: str, primary_ip: str, port: int = 5432, *, to_this_pod: bool = False) -> None:
        # to_this_pod: drop what the primary sends to this pod's `port` instead (its requests to a server
        # here, such as Patroni's REST API), not what comes from the primary's `port`.
        self.netns = netns
        match = "--dport" if to_this_pod else "--sport"
        self.rule = ["INPUT", "-s", primary_ip, "-p", "tcp", match, str(port), "-j", "DROP"]

    def hold(self) -> None:
        _in_netns(self.netns, "iptables", "-w", "-I", *self.rule)

    def release(self) -> None:
        if Path(self.netns).exists():
            _in_netns(self.netns, "iptables", "-w", "-D", *self.rule)


def sql_in_netns(netns: str, dsn: str, query: str) -> str:
    """Run one statement from inside a network namespace (a partitioned pod's own view); returns the
    first column of the first row, or raises CalledProcessError with the client's error. The DSN (it
    holds a password) goes through stdin, never the command line."""
    code = (
        "import sys, psycopg\n"
        "with psycopg.connect(sys.stdin.read(), connect_timeout=3, autocommit=True) as c:\n"
        "    c.execute(\"set statement_timeout = '3s'\")\n"
        "    row = c.execute(sys.argv[1]).fetchone()\n"
        "    print(row[0] if row else '')\n"
    )
    return _in_netns(netns, sys.executable, "-c", code, query, input=dsn).stdout.strip()


class Writer:
    """A client that writes numbered rows through <cluster>-rw for as long as it runs, remembering every
    acknowledged commit and the longest stretch during which no write succeeded. By default one
    connection per attempt; `persistent` keeps one connection and opens a new one only when it broke,
    as an application's pool does. Refused for its password, it reads the `<cluster>-app` Secret again,
    as an application that follows the Secret would. With `verify`, it checks the server as the app
    Secret's URIs ask (verify-full against the Secret's `ca.crt`, by the Service's name), and reads
    `ca.crt` again every few seconds, as an application with the Secret mounted sees it change. With
    `app_uri`, it connects with the Secret's `uri` as it stands (its TLS, fast-failure and read-write
    session settings, docs/connecting.md), adding only `hostaddr` (the host cannot resolve Service names)
    and where `ca.crt` is; it implies `verify`."""

    OUTAGE_GAP_S = 1.0  # a normal attempt takes well under this, even on the loaded 2-CPU node

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        cluster: str,
        table: str,
        *,
        persistent: bool = False,
        verify: bool = False,
        app_uri: bool = False,
    ) -> None:
        self.kube, self.namespace, self.cluster, self.table = kube, namespace, cluster, table
        self.persistent = persistent
        self.verify = verify or app_uri
        self.app_uri = app_uri
        self._ca_file = Path(tempfile.mkdtemp(prefix="pgop-writer-")) / "ca.crt"
        self.password_refusals = 0
        self.failures = 0  # attempts that raised (refused, broken or timed out), acknowledged or not
        self.errors: list[str] = []  # the first few of their messages
        self.acked: list[int] = []
        self.outages: list[float] = []
        # The same outages as wall-clock (start, end), and every failed attempt's (time, message), capped:
        # what a benchmark lines up with the cluster's logs.
        self.spans: list[tuple[float, float]] = []
        self.timeline: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._host = service_ip(kube, namespace, f"{cluster}-rw")
        self._app = secret(kube, namespace, f"{cluster}-app")
        self._write_ca()
        with self._connect() as conn:
            ddl = sql.SQL("create table if not exists {} (id int primary key, at timestamptz default now())")
            conn.execute(ddl.format(sql.Identifier(table)))

    def _write_ca(self) -> None:
        staged = self._ca_file.with_suffix(".new")
        staged.write_text(self._app.get("ca.crt", ""))
        os.replace(staged, self._ca_file)

    def _follow_ca(self) -> None:
        while not self._stop.wait(2):
            with contextlib.suppress(Exception):  # kubectl may fail; the next round retries
                fresh = secret(self.kube, self.namespace, f"{self.cluster}-app")
                if fresh.get("ca.crt") != self._app.get("ca.crt"):
                    self._app = fresh
                    self._write_ca()

    def _connect(self) -> psycopg.Connection[Any]:
        a = self._app
        if self.app_uri:
            return psycopg.connect(
                a["uri"], hostaddr=self._host, sslrootcert=str(self._ca_file), autocommit=True
            )
        tls: dict[str, Any] = {}
        if self.verify:
            tls = {"host": f"{self.cluster}-rw", "hostaddr": self._host, "sslmode": "verify-full",
                   "sslrootcert": str(self._ca_file)}  # fmt: skip
        return psycopg.connect(
            **{"host": self._host, **tls},
            port=int(a["port"]),
            user=a["username"],
            password=a["password"],
            dbname=a["dbname"],
            connect_timeout=2,
            autocommit=True,
            # A primary cut off mid-statement never answers: give up on it as a
            # pooled client would, instead of waiting out TCP's retransmissions.
            tcp_user_timeout=5000,
        )

    def _run(self) -> None:
        n, last_ok = 1, None
        conn: psycopg.Connection[Any] | None = None
        insert = sql.SQL("insert into {} (id) values (%s)").format(sql.Identifier(self.table))
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    conn.execute("set statement_timeout = '5s'")
                conn.execute(insert, (n,))
                if not self.persistent:
                    conn.close()
                    conn = None
                self.acked.append(n)
                # An outage is a gap between two acknowledged writes, whether attempts failed in between
                # or one attempt hung and then succeeded (a commit waiting for a standby).
                now = time.monotonic()
                if last_ok is not None and now - last_ok > self.OUTAGE_GAP_S:
                    self.outages.append(now - last_ok)
                    self.spans.append((time.time() - (now - last_ok), time.time()))
                last_ok = now
            except psycopg.Error as exc:
                self.failures += 1
                if len(self.errors) < 10:
                    self.errors.append(str(exc).strip()[:300])
                if len(self.timeline) < 2000:
                    self.timeline.append((time.time(), str(exc).strip()[:200]))
                if conn is not None:
                    conn.close()
                    conn = None
                if "password authentication failed" in str(exc):
                    self.password_refusals += 1
                    with contextlib.suppress(Exception):  # kubectl may fail; the next refusal retries
                        self._app = secret(self.kube, self.namespace, f"{self.cluster}-app")
            # A new id for every attempt: a failed attempt may still have committed (its answer was
            # lost with the primary), and retrying its id would fail on the primary key forever.
            n += 1
            time.sleep(0.05)
        if conn is not None:
            conn.close()

    def __enter__(self) -> Writer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if self.verify:
            threading.Thread(target=self._follow_ca, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(30)

    def wait_for_writes(self, count: int, timeout: float) -> None:
        target = len(self.acked) + count
        wait_until(f"{count} more acknowledged writes", lambda: len(self.acked) >= target, timeout, 0.1)

    @property
    def longest_outage(self) -> float:
        return max(self.outages, default=0.0)

    def missing(self) -> list[int]:
        """Acknowledged commits that the current primary does not have: lost writes. Read through -rw,
        which may still route to a primary that is shutting down for a moment after a handover."""

        def present() -> tuple[set[int]]:
            with self._connect() as conn:
                query = sql.SQL("select id from {}").format(sql.Identifier(self.table))
                return ({r[0] for r in conn.execute(query).fetchall()},)  # a 1-tuple: truthy when empty

        (rows,) = wait_until(f"the primary to answer for {self.table}", present, 60, 0.5)
        return [n for n in self.acked if n not in rows]
