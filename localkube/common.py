"""Shared plumbing of the local cluster: paths, detached processes, waiting, clear errors.

Standard library only: this runs on a fresh machine before any virtualenv exists.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

NODE_NAME = "localkube-node"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DNS_IP = "10.96.0.10"
POD_CIDR = "10.244.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380

# The full profile's node's run directory (containerd's state and socket): outside the state directory and
# the same path for every cluster (hack/private-netns.sh gives a private cluster a tmpfs of its own there).
RUN_DIR = Path("/run/pg-operator-localkube")


class ClusterError(RuntimeError):
    """A failure the user can act on; printed without a traceback."""


def log(msg: str) -> None:
    print(f"localkube: {msg}", flush=True)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("PGOP_CACHE", f"{base}/pg-operator"))


DEFAULT_STATE = Path("/var/lib/pg-operator-localkube")


def state_dir() -> Path:
    return Path(os.environ.get("PGOP_STATE", str(DEFAULT_STATE)))


@dataclass
class Context:
    """Where everything of one local cluster lives, and how its processes are run."""

    state: Path = field(default_factory=state_dir)
    cache: Path = field(default_factory=cache_dir)

    @property
    def bin(self) -> Path:
        return self.cache / "current"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state / "admin.kubeconfig"

    @property
    def profile_file(self) -> Path:
        return self.state / "profile"

    def kubeconfig(self, component: str) -> Path:
        return self.state / "kubeconfigs" / f"{component}.kubeconfig"

    def binary(self, name: str) -> str:
        path = self.bin / name
        if not path.exists():
            raise ClusterError(f"binary {name} is not built; run localkube/build-binaries.sh")
        return str(path)

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    # --- processes -------------------------------------------------------------------------

    def pid_of(self, name: str) -> int | None:
        """Pid of a component we started, if it is still that process (guards against pid reuse)."""
        pidfile = self.run / f"{name}.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
            exe_hint = pidfile.read_text().split(maxsplit=1)[1].strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError, IndexError):
            return None
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None
        return pid if Path(cmdline).name == Path(exe_hint).name else None

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, netns: str | None = None
    ) -> int:
        """Start a component detached from this process, logging to logs/<name>.log; with `netns`, in that
        named network namespace (nsenter: the mount namespace stays the host's, so the kubelet's mounts
        and the runtime's are the same ones)."""
        self.log_path(name).parent.mkdir(parents=True, exist_ok=True)
        (self.run / f"{name}.pid").parent.mkdir(parents=True, exist_ok=True)
        logf = self.log_path(name).open("ab")
        logf.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {' '.join(argv)}\n".encode())
        logf.flush()
        prefix = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
        proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            close_fds=True,
        )
        logf.close()
        (self.run / f"{name}.pid").write_text(f"{proc.pid} {argv[0]}\n")
        # Until the child has exec'd, /proc shows our own command line and pid_of() would call the
        # component dead: wait for the exec (or the exit) before anyone looks.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None and self.pid_of(name) is None:
            time.sleep(0.01)
        return proc.pid

    def stop_process(self, name: str, timeout: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after timeout. Returns whether something was running."""
        pid = self.pid_of(name)
        pidfile = self.run / f"{name}.pid"
        if pid is None:
            pidfile.unlink(missing_ok=True)
            return False
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.pid_of(name) is not None:
                time.sleep(0.1)
            if self.pid_of(name) is None:
                break
        pidfile.unlink(missing_ok=True)
        return True

    def ensure_alive(self, name: str) -> None:
        if self.pid_of(name) is None:
            raise ClusterError(f"{name} exited during start-up.\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.log_path(name)
        try:
            # The Kubernetes components print every flag at start: those say nothing about why one stopped.
            kept = [line for line in path.read_text(errors="replace").splitlines() if "flags.go:" not in line]
            tail = kept[-lines:]
        except OSError:
            tail = ["(no log)"]
        body = "\n".join(f"    {line}" for line in tail)
        return f"last lines of {path}:\n{body}\n(whole log: {path})"

    # --- API access ---------------------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary("kubectl"), "--kubeconfig", str(self.admin_kubeconfig), *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res

    def api_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET a path on the API server as admin, with the admin client certificate."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        url = f"https://127.0.0.1:{APISERVER_PORT}{path}"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            return 0, str(e)


def node_dirs(ctx: Context, node: str | None = None) -> dict[str, Path]:
    """The full profile's node's directories (host.prepare makes them, teardown.clean empties some); with
    a node name, those of that node of a multi-node cluster (under nodes/<name>)."""
    s = ctx.state if node is None else ctx.state / "nodes" / node
    run = RUN_DIR if node is None else RUN_DIR / "nodes" / node
    return {
        "containerd_root": s / "containerd",
        "containerd_state": run / "containerd",
        "containerd_opt": s / "containerd-opt",
        "cni_conf": s / "cni" / "net.d",
        "cni_ipam": s / "cni" / "ipam",
        "kubelet_root": s / "kubelet",
        "kubelet_plugins": s / "kubelet-plugins",
        "pod_logs": s / "pod-logs",
        "config": s / "node",
        "volumes": s / "volumes",
    }


def containerd_address(ctx: Context, node: str | None = None) -> str:
    return str(node_dirs(ctx, node)["containerd_state"] / "containerd.sock")


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    ctx: Context | None = None,
    component: str | None = None,
    interval: float = 0.2,
) -> None:
    """Poll until check() is true; on timeout say what and show the component's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if component and ctx and ctx.pid_of(component) is None:
            raise ClusterError(f"{component} exited while waiting for {what}.\n{ctx.log_tail(component)}")
        try:
            if check():
                return
        except Exception:  # noqa: S110 - any failure of a probe just means "not yet"
            pass
        time.sleep(interval)
    hint = f"\n{ctx.log_tail(component)}" if component and ctx else ""
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{hint}")


def port_holder(port: int) -> str | None:
    """Describe the process listening on a TCP port, or None if the port is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - probing only
            return None
        except OSError:
            pass
    res = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True)
    return res.stdout.strip() or "an unknown process"


def require_ports_free(ports: dict[int, str]) -> None:
    busy = []
    for port, purpose in ports.items():
        holder = port_holder(port)
        if holder:
            busy.append(f"port {port} ({purpose}) is in use by: {holder}")
    if busy:
        raise ClusterError(
            "cannot start:\n  "
            + "\n  ".join(busy)
            + "\nstop that process, or run `make cluster-down` if it is a leftover cluster"
        )


def require_commands(needs: dict[str, str]) -> None:
    """needs maps a command to the Debian package that provides it."""
    missing = {cmd: pkg for cmd, pkg in needs.items() if shutil.which(cmd) is None}
    if missing:
        pkgs = " ".join(sorted(set(missing.values())))
        raise ClusterError(f"missing {', '.join(sorted(missing))}; install with: apt-get install -y {pkgs}")


def host_ip() -> str:
    """The host's primary IPv4 address: what the API server advertises and pods can reach."""
    res = subprocess.run(["ip", "-4", "-j", "route", "get", "1.1.1.1"], capture_output=True, text=True)
    try:
        return str(json.loads(res.stdout)[0]["prefsrc"])
    except (ValueError, LookupError):
        raise ClusterError("cannot find the host's IPv4 address (no default route?)") from None


def write_json(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def fail(err: ClusterError) -> None:
    print(f"localkube: error: {err}", file=sys.stderr, flush=True)
    sys.exit(1)
