"""A real Kubernetes built from upstream sources: `up [kwok|full]`, `down`, `status`, `kubeconfig`,
`reset`, and for a multi-node full profile `poweroff|poweron|partition|heal <node>`.

Profiles:
  kwok  etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK fake nodes
  full  the same control plane + a real node (containerd, runc, CNI bridge, kubelet, kube-proxy);
        PGOP_FULL_NODES=N (2-9) gives N real nodes, each in its own network namespace and zone
        (PGOP_FULL_ZONES=M spreads them over M zones instead)

Node verbs (multi-node full profile):
  poweroff <node>   cut its link, SIGKILL its kubelet, runtime, proxy and every container: a power loss
  poweron <node>    boot it again: runtime, kubelet, proxy, policy; returns when the Node is Ready
  partition <node>  cut its link; every process lives on
  heal <node>       restore its link
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path

from localkube import addons, controlplane, host, kwoknodes, node, nodes, topology
from localkube.common import (
    HERE,
    ClusterError,
    Context,
    fail,
    host_ip,
    log,
    require_commands,
    require_ports_free,
)
from localkube.pki import Pki, ensure_kubeconfigs

PROFILES = ("kwok", "full")
BASE_PACKAGES = {"openssl": "openssl", "ip": "iproute2", "ss": "iproute2"}


def node_alive(ctx: Context) -> bool:
    return any(ctx.pid_of(n) is not None for n in node.COMPONENTS)


def running_profile(ctx: Context) -> str | None:
    try:
        return ctx.profile_file.read_text().strip() or None
    except OSError:
        return None


def layout(ctx: Context) -> list[topology.NodeSpec]:
    try:
        return topology.load_layout(ctx)
    except ClusterError:
        return []


def alive_components(ctx: Context) -> list[str]:
    names = [*controlplane.COMPONENTS, "kwok", *node.COMPONENTS, *nodes.components(layout(ctx))]
    return [n for n in names if ctx.pid_of(n) is not None]


def ready_marker(ctx: Context) -> Path:
    """Written when `up` finished; a cluster without it was interrupted or failed half-way."""
    return ctx.state / "ready"


def healthy(ctx: Context) -> bool:
    return ready_marker(ctx).exists() and ctx.api_get("/readyz")[0] == 200


def install_packages(packages: list[str]) -> None:
    log(f"installing {' '.join(packages)}")
    env_cmd = ["env", "DEBIAN_FRONTEND=noninteractive"]
    subprocess.run([*env_cmd, "apt-get", "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        [*env_cmd, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def check_prereqs(profile: str, install: bool) -> None:
    """Install what is missing when we may (root), otherwise name the package and the command."""
    install = install or os.geteuid() == 0
    needs = dict(BASE_PACKAGES)
    missing = {cmd: pkg for cmd, pkg in needs.items() if shutil.which(cmd) is None}
    full = profile == "full"
    node_missing = host.missing_prereqs() if full else []
    if install and (missing or node_missing):
        pkgs = sorted(set(missing.values()) | set(host.APT_PACKAGES if full else []))
        install_packages(pkgs)
        node_missing = host.missing_prereqs() if full else []
    require_commands(needs)
    if node_missing:
        lines = "\n  ".join(f"{what}: {how}" for what, how in node_missing)
        raise ClusterError(f"missing prerequisites for the full profile:\n  {lines}\n(or run with --install)")


def build_binaries() -> None:
    res = subprocess.run([str(HERE / "build-binaries.sh")], capture_output=True, text=True)
    for line in res.stdout.splitlines():
        log(line)
    if res.returncode != 0:
        raise ClusterError(f"building the binaries failed:\n{res.stderr[-3000:]}")


def cmd_up(ctx: Context, profile: str, install: bool) -> None:
    full = profile == "full"
    wanted = topology.requested_layout(os.environ) if full else []
    current = running_profile(ctx)
    if current and alive_components(ctx):
        if current != profile:
            raise ClusterError(
                f"the {current} profile is running; run `make cluster-down` first, "
                f"then `make cluster-up PROFILE={profile}`"
            )
        have = len(layout(ctx)) or 1
        if full and have != (len(wanted) or 1):
            log(f"the full profile runs {have} node(s), {len(wanted) or 1} asked for: starting it again")
        elif healthy(ctx):
            log(
                f"the {profile} profile is already running (nothing to do); "
                f"export KUBECONFIG={ctx.admin_kubeconfig}"
            )
            return
        log(f"the {profile} profile is running but not healthy: restarting it")
    if current or alive_components(ctx):
        log("clearing what an earlier cluster left behind")
        teardown(ctx, quiet=True)
    start = time.monotonic()
    check_prereqs(profile, install)
    build_binaries()
    ports = dict(controlplane.PORTS)
    if full:  # many nodes listen in their own namespaces; only CoreDNS's health ports are the host's
        ports.update({p: w for p, w in node.PORTS.items() if p in NODES_HOST_PORTS} if wanted else node.PORTS)
    require_ports_free(ports)
    ctx.state.mkdir(parents=True, exist_ok=True)
    ctx.profile_file.write_text(profile + "\n")
    ip = host_ip()
    pki = Pki(ctx.pki)
    pki.ensure(ip)
    ensure_kubeconfigs(ctx, pki)
    if full:
        node.prepare_host(ctx)
    controlplane.start(ctx, pki, ip)
    if full and wanted:
        nodes.start(ctx, pki, wanted)
    elif full:
        node.start(ctx, pki)
    else:
        kwoknodes.start(ctx)
    addons.install_storage(ctx, per_node=bool(wanted))
    ready_marker(ctx).touch()
    log(
        f"the {profile} profile is up in {time.monotonic() - start:.1f} s; "
        f"export KUBECONFIG={ctx.admin_kubeconfig}"
    )


def teardown(ctx: Context, quiet: bool = False) -> None:
    nodes.stop(ctx, layout(ctx))  # many nodes' kubelets, proxies and policy controllers (none: no-op)
    if running_profile(ctx) != "kwok" or node_alive(ctx):
        node.stop(ctx)
    kwoknodes.stop(ctx)
    controlplane.stop(ctx)
    node.cleanup_leftovers(ctx)
    # Cluster data is disposable: the next `up` starts from an empty etcd. The cache stays.
    shutil.rmtree(ctx.state, ignore_errors=True)
    if not quiet:
        log("cluster is down")


def cmd_down(ctx: Context) -> None:
    start = time.monotonic()
    if not running_profile(ctx) and not alive_components(ctx) and not ctx.state.exists():
        node.cleanup_leftovers(ctx)
        log("no cluster is running (nothing to do)")
        return
    teardown(ctx)
    log(f"down in {time.monotonic() - start:.1f} s")


def cmd_status(ctx: Context) -> int:
    profile = running_profile(ctx)
    alive = alive_components(ctx)
    if not profile and not alive:
        print("no cluster is running")
        return 1
    print(f"profile: {profile or 'unknown'}")
    print(f"kubeconfig: {ctx.admin_kubeconfig}")
    if profile == "full":
        print(f"nodes: {len(layout(ctx)) or 1}")
    for name in alive:
        print(f"  {name}: running (pid {ctx.pid_of(name)}), log {ctx.log_path(name)}")
    for line in nodes.status_lines(ctx):
        print(line)
    state = "ready" if healthy(ctx) else "NOT ready (up did not finish, or the API server is down)"
    print(f"cluster: {state}")
    return 0 if healthy(ctx) else 1


NODE_VERBS = {
    "poweroff": "a node loses power: link cut, its kubelet, runtime, proxy and containers SIGKILLed",
    "poweron": "a powered-off node boots again; returns when it is Ready",
    "partition": "cut a node's link; its processes live on",
    "heal": "restore a partitioned node's link",
}
NODE_VERB_ACTIONS = {"poweroff": nodes.poweroff, "poweron": nodes.poweron,
                     "partition": nodes.partition, "heal": nodes.heal}  # fmt: skip
NODES_HOST_PORTS = (18180, 18181)  # CoreDNS's health and ready ports, on the host


def cmd_node_verb(ctx: Context, verb: str, name: str) -> None:
    if running_profile(ctx) != "full" or not healthy(ctx):
        raise ClusterError(f"{verb}: no full profile is running")
    target = topology.find_node(layout(ctx), name)
    NODE_VERB_ACTIONS[verb](ctx, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="localkube", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build what is missing and start a profile")
    up.add_argument("profile", nargs="?", default="kwok", choices=PROFILES)
    up.add_argument(
        "--install",
        action="store_true",
        help="apt-get install missing prerequisites (the default when run as root)",
    )
    sub.add_parser("down", help="stop everything and remove every trace")
    sub.add_parser("reset", help="the same as down, for a broken cluster: clears every leftover it can find")
    sub.add_parser("status", help="what is running")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    for verb, what in NODE_VERBS.items():
        sub.add_parser(verb, help=what).add_argument("node", help="a node's name (or its number)")
    args = parser.parse_args(argv)
    ctx = Context()
    try:
        if args.cmd == "up":
            cmd_up(ctx, args.profile, args.install)
        elif args.cmd in ("down", "reset"):
            cmd_down(ctx)
        elif args.cmd == "status":
            return cmd_status(ctx)
        elif args.cmd == "kubeconfig":
            print(ctx.admin_kubeconfig)
        elif args.cmd in NODE_VERBS:
            cmd_node_verb(ctx, args.cmd, args.node)
    except ClusterError as e:
        fail(e)
    except KeyboardInterrupt:
        return 130
    return 0
