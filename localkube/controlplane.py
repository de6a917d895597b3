"""The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as host processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from localkube.common import (
    APISERVER_PORT,
    CLUSTER_DOMAIN,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    SERVICE_CIDR,
    ClusterError,
    Context,
    host_ip,
    log,
    wait_for,
)
from localkube.pki import Pki

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
PORTS = {
    ETCD_CLIENT_PORT: "etcd client",
    ETCD_PEER_PORT: "etcd peer",
    2381: "etcd metrics",
    APISERVER_PORT: "kube-apiserver",
    10257: "kube-controller-manager",
    10259: "kube-scheduler",
}

# Requests by people and operators are audited; the cluster's own components are not, so the log
# stays small and a test can count exactly what one client (say, the operator) wrote.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": [
                "system:kube-controller-manager",
                "system:kube-scheduler",
                "system:kube-proxy",
                "system:apiserver",
                "localkube-kwok",
            ],
        },
        {"level": "None", "userGroups": ["system:nodes"]},
        {"level": "None", "users": ["system:serviceaccount:kube-system:*"]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version", "/metrics"]},
        {
            "level": "None",
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            "namespaces": ["kube-system", "kube-node-lease"],
        },
        {"level": "Metadata"},
    ],
}


def audit_log(ctx: Context) -> str:
    return str(ctx.logs / "audit.log")


def start_etcd(ctx: Context) -> None:
    data = ctx.state / "etcd"
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    ctx.spawn(
        "etcd",
        [
            ctx.binary("etcd"),
            "--name",
            "localkube",
            "--data-dir",
            str(data),
            "--listen-client-urls",
            f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-cluster",
            f"localkube=http://127.0.0.1:{ETCD_PEER_PORT}",
            "--listen-metrics-urls",
            "http://127.0.0.1:2381",
            # A throwaway dev/test cluster: durability across host crashes is not worth the fsync cost.
            "--unsafe-no-fsync",
            "--quota-backend-bytes",
            str(4 * 1024**3),
            "--log-level",
            "warn",
        ],
    )


def start_apiserver(ctx: Context, pki: Pki, host_ip: str) -> None:
    policy = ctx.state / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY, indent=2))
    crt, key = pki.apiserver
    kcrt, kkey = pki.pair("apiserver-kubelet-client")
    ctx.spawn(
        "kube-apiserver",
        [
            ctx.binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            # 0.0.0.0 so pods reach it (through the `kubernetes` Service and directly) in the full profile.
            "--bind-address=0.0.0.0",
            f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={host_ip}",
            f"--tls-cert-file={crt}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--kubelet-client-certificate={kcrt}",
            f"--kubelet-client-key={kkey}",
            f"--kubelet-certificate-authority={pki.ca_crt}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log(ctx)}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            "--audit-log-mode=blocking",
            "--v=1",
        ],
    )


def start_controller_manager(ctx: Context, pki: Pki) -> None:
    kc = ctx.kubeconfig("controller-manager")
    ctx.spawn(
        "kube-controller-manager",
        [
            ctx.binary("kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_crt}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_crt}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            # A dev cluster on a loaded 2-core box: don't let API throttling dominate test timings.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--concurrent-statefulset-syncs=20",
            "--concurrent-gc-syncs=40",
            "--v=1",
        ],
    )


def start_scheduler(ctx: Context) -> None:
    kc = ctx.kubeconfig("scheduler")
    config = ctx.state / "scheduler-config.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kc), "qps": 200, "burst": 400},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    ctx.spawn(
        "kube-scheduler",
        [
            ctx.binary("kube-scheduler"),
            f"--config={config}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--secure-port=10259",
            "--v=1",
        ],
    )


def start(ctx: Context, pki: Pki, host_ip: str) -> None:
    start_etcd(ctx)
    wait_for("etcd to answer", lambda: ctx.pid_of("etcd") is not None and _etcd_healthy(), 30, ctx, "etcd")
    start_apiserver(ctx, pki, host_ip)
    wait_for(
        "the API server to be ready", lambda: ctx.api_get("/readyz")[0] == 200, 90, ctx, "kube-apiserver"
    )
    start_controller_manager(ctx, pki)
    start_scheduler(ctx)
    # The service-account controller making `default` in a namespace is the sign that KCM works.
    wait_for(
        "the controller-manager (default service account)",
        lambda: ctx.api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        60,
        ctx,
        "kube-controller-manager",
    )
    wait_for(
        "the scheduler to be healthy",
        lambda: (
            ctx.pid_of("kube-scheduler") is not None and ctx.api_get("/api/v1/namespaces/default")[0] == 200
        ),
        30,
        ctx,
        "kube-scheduler",
    )
    log("control plane is up")


def restart_apiserver(ctx: Context, while_down: Callable[[], None] = lambda: None) -> float:
    """Kill the API server, run `while_down` (e.g. change etcd behind its back), start it again with the
    same flags; seconds it was unavailable. For tests of what clients do when their watches break.
    Killed, not stopped: its graceful shutdown outlasted stop_process's 10 s here, most of a 15 s lease."""
    started = time.monotonic()
    ctx.stop_process("kube-apiserver", timeout=0.2)
    while_down()
    # On a loaded machine the new process has been seen to exit right after printing its version; its
    # flags are the ones that just worked, so it is started once more before the restart counts as failed.
    for attempt in (1, 2):
        start_apiserver(ctx, Pki(ctx.pki), host_ip())
        try:
            wait_for(
                "the API server to be ready",
                lambda: ctx.api_get("/readyz")[0] == 200,
                90,
                ctx,
                "kube-apiserver",
            )
            break
        except ClusterError as exc:
            if attempt == 2 or ctx.pid_of("kube-apiserver") is not None:
                raise
            log(f"kube-apiserver exited while starting again; once more: {str(exc).splitlines()[0]}")
            time.sleep(2)
    return time.monotonic() - started


def _etcd_healthy() -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health", timeout=2) as r:
        return bool(json.loads(r.read()).get("health") == "true")


def stop(ctx: Context) -> None:
    for name in reversed(COMPONENTS):
        if ctx.stop_process(name):
            log(f"stopped {name}")
