"""The operator's cache after its watches break (kwok profile): the API server restarts, and an object
deleted meanwhile straight from etcd (so no watch could ever report the deletion, and the compaction
makes every watch that resumes from before it relist) is dropped from the cache and recreated by the
same operator process. Without the relist pruning the cache keeps the deleted object and no pass ever
recreates it."""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

import pytest
from localkube import controlplane
from localkube.common import ETCD_CLIENT_PORT

from harness.kube import apply, get_or_none, make_namespace
from harness.objects import cluster
from harness.operator_process import OperatorEnv, start_operator
from harness.waiting import wait_until


def etcd(call: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's v3 JSON gateway (keys base64-encoded)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{ETCD_CLIENT_PORT}/v3/{call}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (a fixed http URL)
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_an_object_deleted_while_the_watches_were_down_is_recreated(operator_env: OperatorEnv) -> None:
    kube = operator_env.kube
    ctx = getattr(kube, "ctx", None)
    if ctx is None:
        pytest.skip("restarts the local cluster's API server: not run against an external cluster")
    ns = make_namespace(kube, "relist")
    # Its own namespace only: other modules' clusters, going away meanwhile, stay out of its cache.
    op = start_operator(operator_env, "relist", "--namespace", ns, "--resync-seconds", "600")
    try:
        op.wait_leader()
        apply(kube, cluster("relist-db", ns, replicas=1))
        name = "relist-db-instance"  # the instance ConfigMap (specs.names.instance)
        before = wait_until(
            "the instance ConfigMap", lambda: get_or_none(kube, "configmap", name, "-n", ns), timeout=60
        )
        key = f"/registry/configmaps/{ns}/{name}"

        def delete_behind_its_back() -> None:
            deleted = etcd("kv/deleterange", {"key": b64(key)})
            assert deleted.get("deleted") == "1", deleted
            etcd("kv/compaction", {"revision": deleted["header"]["revision"], "physical": True})

        down = controlplane.restart_apiserver(ctx, delete_behind_its_back)
        after = wait_until(
            "the same operator to recreate the ConfigMap",
            lambda: get_or_none(kube, "configmap", name, "-n", ns),
            timeout=120,
        )
        assert after["metadata"]["uid"] != before["metadata"]["uid"]  # deleted, then made anew
        assert op.alive(), f"the operator exited (API server down {down:.1f} s):\n{op.log_text()[-3000:]}"
        assert "configmaps of 1 cluster(s) gone while the watch was down" in op.log_text()
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        op.stop()
