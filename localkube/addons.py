"""What a cluster has beside its nodes: cluster DNS (CoreDNS, full profile) and the default StorageClass
with its provisioner (both profiles)."""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

from localkube.common import CLUSTER_DNS_IP, CLUSTER_DOMAIN, HERE, NODE_NAME, Context, node_dirs, wait_for
from localkube.network import BRIDGE_IP

STORAGE_CLASS = "standard"
PROVISIONER = "localkube.local/hostpath"


# --- cluster DNS -----------------------------------------------------------------------------------------
# CoreDNS (built from its Go module, localkube/modules/coredns) runs on the host and listens on the
# bridge address; the `kube-dns` Service in kube-system has the usual ClusterIP and an EndpointSlice
# pointing at that address, so pods use the standard clusterDNS IP through kube-proxy. On the host it
# needs no image, starts in well under a second and is not subject to pod scheduling.


def _corefile(ctx: Context) -> str:
    return f""".:53 {{
    bind {BRIDGE_IP}
    health 127.0.0.1:18180
    ready 127.0.0.1:18181
    errors
    cache 5
    loadbalance
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {ctx.admin_kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
}}
"""


def _dns_objects(node_name: str | None = NODE_NAME) -> str:
    ports = [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]},
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-host",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "localkube",
            },
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [BRIDGE_IP],
                "conditions": {"ready": True},
                **({"nodeName": node_name} if node_name else {}),
            }
        ],
        "ports": ports,
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, slice_]})


def start_dns(ctx: Context, node_name: str | None = NODE_NAME) -> None:
    """CoreDNS on the host. With many nodes the host keeps BRIDGE_IP on the node bridge (nodenet.py), so
    the address and the Service are the same; the endpoint then belongs to no node (node_name None)."""
    corefile = node_dirs(ctx)["config"] / "Corefile"
    corefile.write_text(_corefile(ctx))
    ctx.spawn("coredns", [ctx.binary("coredns"), "-conf", str(corefile)])

    def ready() -> bool:
        with urllib.request.urlopen("http://127.0.0.1:18181/ready", timeout=2) as r:
            return bool(r.status == 200)

    wait_for("CoreDNS to be ready", ready, 30, ctx, "coredns")
    ctx.kubectl("apply", "-f", "-", input=_dns_objects(node_name))


# --- storage ----------------------------------------------------------------------------------------------
# Why not kube-controller-manager's --enable-hostpath-provisioner: its PVs are hostPath volumes in
# 0750 root-owned directories, and the kubelet applies no fsGroup to hostPath, so a PostgreSQL pod
# running as uid 999 cannot write its data directory. Our provisioner (localkube/hostpath) makes
# `local` PVs instead — one directory per claim under <state>/volumes, node affinity to the node the
# scheduler picked (WaitForFirstConsumer) — and the kubelet gives `local` volumes the pod's fsGroup.
# It only talks to the API server, so it serves the kwok profile too (claims bind, nothing mounts).


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
    }


def install_storage(ctx: Context, per_node: bool = False) -> None:
    """The default StorageClass `standard` and the provisioner that binds its claims. With `per_node`
    (a multi-node cluster) each volume lives in its node's own directory (nodes/<node>/volumes) and is
    neither made nor removed while that node is powered off: a node-local disk, as a real one."""
    script = HERE / "hostpath" / "provisioner.py"
    volumes = node_dirs(ctx)["volumes"]
    volumes.mkdir(parents=True, exist_ok=True)
    where = ["--node-volumes", str(ctx.state / "nodes")] if per_node else ["--volumes", str(volumes)]
    if ctx.pid_of("provisioner") is None:
        ctx.spawn(
            "provisioner",
            [
                sys.executable,
                str(script),
                "--state",
                str(ctx.state),
                *where,
                "--provisioner",
                PROVISIONER,
                "--storage-class",
                STORAGE_CLASS,
            ],
        )
    ctx.kubectl("apply", "-f", "-", input=json.dumps(storage_class()))
    ready = ctx.run / "provisioner.ready"
    wait_for("the storage provisioner", ready.exists, 15, ctx, "provisioner")


def stop_storage(ctx: Context) -> None:
    ctx.stop_process("provisioner", timeout=5)
    (ctx.run / "provisioner.ready").unlink(missing_ok=True)
