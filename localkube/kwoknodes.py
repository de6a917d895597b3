"""The kwok profile's nodes: KWOK (out of cluster) marks fake nodes Ready and their pods Running/Ready.

No process runs behind those pods; the profile exists for operator logic and scale, where the real API
server, scheduler, garbage collector and StatefulSet controller matter and PostgreSQL does not.
"""

from __future__ import annotations

import json
import os

from localkube.common import Context, log, wait_for

ANNOTATION = "kwok.x-k8s.io/node"
# Pod IPs KWOK hands out; a /16 so a scale test of a few thousand pods never runs dry.
KWOK_POD_CIDR = "10.240.0.1/16"


def node_names() -> list[str]:
    count = int(os.environ.get("PGOP_KWOK_NODES", "1"))
    return [f"kwok-node-{i}" for i in range(count)]


def node_object(name: str) -> dict[str, object]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "5000", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "topology.kubernetes.io/zone": "local",
            },
        },
        "spec": {},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


def start(ctx: Context) -> None:
    # An explicit (empty) configuration so a ~/.kwok/kwok.yaml on the machine cannot change behaviour;
    # KWOK then uses its built-in stages: nodes Ready, pods Running and Ready right after scheduling.
    (ctx.state / "kwok.yaml").touch()
    ctx.spawn(
        "kwok",
        [
            ctx.binary("kwok"),
            f"--kubeconfig={ctx.kubeconfig('kwok')}",
            f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
            f"--cidr={KWOK_POD_CIDR}",
            "--node-lease-duration-seconds=40",
            f"--config={ctx.state / 'kwok.yaml'}",
        ],
    )
    items = {"apiVersion": "v1", "kind": "List", "items": [node_object(n) for n in node_names()]}
    ctx.kubectl("apply", "-f", "-", input=json.dumps(items))
    for name in node_names():
        wait_for(f"fake node {name} to be Ready", lambda n=name: _node_ready(ctx, n), 60, ctx, "kwok")
    log(f"kwok nodes ready: {', '.join(node_names())}")


def _node_ready(ctx: Context, name: str) -> bool:
    res = ctx.kubectl(
        "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
    )
    return res.stdout.strip() == "True"


def stop(ctx: Context) -> None:
    if ctx.stop_process("kwok"):
        log("stopped kwok")
