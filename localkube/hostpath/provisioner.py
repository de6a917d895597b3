#!/usr/bin/env python3
"""Dynamic provisioner of the local cluster's `standard` StorageClass (standard library only).

For every claim of the class that the scheduler has placed (WaitForFirstConsumer sets the
`volume.kubernetes.io/selected-node` annotation), it makes a directory under --volumes and a `local`
PersistentVolume for it with node affinity to that node and a claimRef, which the PV controller then
binds. `local` rather than `hostPath`: the kubelet applies the pod's fsGroup to `local` volumes, so
a PostgreSQL pod running as uid 999 can write its data directory. Released volumes (reclaim policy
Delete) are removed with their directory. Growing a claim grows the PV's recorded capacity (a
directory has no size of its own), which is what an external resizer would do.

Claims and volumes come from two watches (LIST once, then WATCH from its resourceVersion; LIST again
after any error, an expired version or the API server's restart). The pass over the cached objects runs
at every change and at least once a second, for what no event announces (a volume the kubelet has just
unmounted). A LIST of every claim and volume each second cost 87 % of a core at 1000 clusters.
"""

from __future__ import annotations

import argparse
import json
import shutil
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


class Api:
    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=self.tls, timeout=10) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def stream(self, path: str, timeout: float) -> Any:
        req = urllib.request.Request(self.server + path, headers={"Accept": "application/json"})  # noqa: S310
        return urllib.request.urlopen(req, context=self.tls, timeout=timeout)  # noqa: S310


class Watched:
    """Every object of one collection, kept current by LIST and WATCH in a thread of its own."""

    WATCH_SECONDS = 60  # the server ends each watch after this; the next starts from the last version

    def __init__(self, api: Api, path: str, changed: threading.Event) -> None:
        self.api, self.path, self.changed = api, path, changed
        self.items: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.listed = threading.Event()
        self.error = ""

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.items.values())

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"watch {self.path}", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                version = self._list()
                while version:
                    version = self._watch(version)
            except Exception as e:  # whatever ends a watch (a cut stream raises http.client's own errors)
                self.error = f"{self.path}: {type(e).__name__}: {e}"
                time.sleep(1)

    def _list(self) -> str:
        code, body = self.api.call("GET", self.path)
        if code != 200:
            raise RuntimeError(f"HTTP {code}: {body}")
        with self.lock:
            self.items = {o["metadata"]["uid"]: o for o in body["items"]}
        self.error = ""
        self.listed.set()
        self.changed.set()
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Apply events until the server ends the watch; the version to go on from, "" to LIST again."""
        query = (
            f"?watch=1&allowWatchBookmarks=true&timeoutSeconds={self.WATCH_SECONDS}&resourceVersion={version}"
        )
        with self.api.stream(self.path + query, self.WATCH_SECONDS + 30) as resp:
            for line in resp:
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    return ""  # 410 Gone (the version expired) or another error: LIST again
                version = obj["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                with self.lock:
                    if event["type"] == "DELETED":
                        self.items.pop(obj["metadata"]["uid"], None)
                    else:
                        self.items[obj["metadata"]["uid"]] = obj
                self.changed.set()
        return version


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def quantity_bytes(q: str) -> float:
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
        "k": 1e3,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "P": 1e15,
        "E": 1e18,
        "m": 1e-3,
    }
    for suffix in sorted(units, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * units[suffix]
    return float(q)


def persistent_volume(
    pvc: dict[str, Any], node: str, path: Path, storage_class: str, provisioner: str
) -> dict[str, Any]:
    meta, spec = pvc["metadata"], pvc["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {PROVISIONED_BY: provisioner},
            "labels": {"localkube.local/claim-namespace": meta["namespace"]},
        },
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": storage_class,
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }


def mounted_under(path: Path) -> bool:
    prefix = str(path) + "/"
    with open("/proc/self/mountinfo") as f:
        return any((line.split()[4] + "/").startswith(prefix) for line in f)


class Provisioner:
    """`volumes` holds every volume (one node); with `per_node`, it holds a directory per node and each
    volume lives under <volumes>/<node>/volumes, untouched while <volumes>/<node>/power says the node is
    powered off (its disk is unreachable: nothing is made there, nothing removed)."""

    def __init__(
        self, api: Api, volumes: Path, storage_class: str, name: str, per_node: bool = False
    ) -> None:
        self.api, self.volumes, self.storage_class, self.name = api, volumes, storage_class, name
        self.per_node = per_node

    def volume_root(self, node: str) -> Path:
        return self.volumes / node / "volumes" if self.per_node else self.volumes

    def reachable(self, node: str) -> bool:
        if not self.per_node:
            return True
        try:
            return (self.volumes / node / "power").read_text().strip() != "powered-off"
        except OSError:
            return True

    def sync(self, pvcs: list[dict[str, Any]], pvs: list[dict[str, Any]]) -> None:
        by_name = {pv["metadata"]["name"]: pv for pv in pvs}
        # Claims some PV already names (pre-bound by whoever made it): the PV controller binds those.
        claimed = {(pv["spec"].get("claimRef") or {}).get("uid") for pv in pvs}
        for pvc in pvcs:
            if pvc["spec"].get("storageClassName") != self.storage_class:
                continue
            if not pvc["spec"].get("volumeName"):
                if pvc["metadata"]["uid"] not in claimed:
                    self.provision(pvc, by_name)
            elif pvc.get("status", {}).get("phase") == "Bound":
                self.resize(pvc, by_name.get(pvc["spec"]["volumeName"]))
        for pv in pvs:
            ours = pv["metadata"].get("annotations", {}).get(PROVISIONED_BY) == self.name
            if ours and pv.get("status", {}).get("phase") in ("Released", "Failed"):
                self.delete(pv)

    def provision(self, pvc: dict[str, Any], existing: dict[str, Any]) -> None:
        meta = pvc["metadata"]
        node = meta.get("annotations", {}).get(SELECTED_NODE)
        if not node or f"pvc-{meta['uid']}" in existing or meta.get("deletionTimestamp"):
            return  # not scheduled yet (WaitForFirstConsumer), already provisioned, or going away
        if pvc["spec"].get("volumeMode", "Filesystem") != "Filesystem":
            log(f"{meta['namespace']}/{meta['name']}: only volumeMode Filesystem is supported")
            return
        if "/" in node or node in ("", ".", "..") or not self.reachable(node):
            return  # a node name that is no directory name, or a node that is powered off
        path = self.volume_root(node) / f"pvc-{meta['uid']}"
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        code, body = self.api.call(
            "POST",
            "/api/v1/persistentvolumes",
            persistent_volume(pvc, node, path, self.storage_class, self.name),
        )
        if code in (200, 201):
            log(f"provisioned {path.name} for {meta['namespace']}/{meta['name']} on {node}")
        elif code != 409:
            log(f"creating the volume of {meta['namespace']}/{meta['name']} failed: HTTP {code}: {body}")

    def resize(self, pvc: dict[str, Any], pv: dict[str, Any] | None) -> None:
        if pv is None or pv["metadata"].get("annotations", {}).get(PROVISIONED_BY) != self.name:
            return
        want = pvc["spec"]["resources"]["requests"]["storage"]
        if quantity_bytes(pv["spec"]["capacity"]["storage"]) < quantity_bytes(want):
            self.api.call(
                "PATCH",
                f"/api/v1/persistentvolumes/{pv['metadata']['name']}",
                {"spec": {"capacity": {"storage": want}}},
                "application/merge-patch+json",
            )
        have = pvc.get("status", {}).get("capacity", {}).get("storage", "0")
        if quantity_bytes(have) < quantity_bytes(want):
            meta = pvc["metadata"]
            code, body = self.api.call(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/persistentvolumeclaims/{meta['name']}/status",
                {
                    "status": {
                        "capacity": {"storage": want},
                        "conditions": None,
                        "allocatedResources": {"storage": want},
                    }
                },
                "application/merge-patch+json",
            )
            if code == 200:
                log(f"resized {meta['namespace']}/{meta['name']} to {want}")
            else:
                log(f"resizing {meta['namespace']}/{meta['name']} failed: HTTP {code}: {body}")

    def delete(self, pv: dict[str, Any]) -> None:
        path = Path(pv["spec"].get("local", {}).get("path", ""))
        node = path.parent.parent.name if self.per_node else ""
        if path.parent != self.volume_root(node):
            log(f"not deleting {pv['metadata']['name']}: its path {path} is not under {self.volumes}")
            return
        if not self.reachable(node):
            return  # its node is powered off: the directory is removed once it is back
        if mounted_under(path):
            return  # the kubelet has not unmounted it yet; next round
        shutil.rmtree(path, ignore_errors=True)
        code, body = self.api.call("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        if code in (200, 202, 404):
            log(f"deleted {pv['metadata']['name']} and its directory")
        else:
            log(f"deleting {pv['metadata']['name']} failed: HTTP {code}: {body}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state", required=True, type=Path, help="the local cluster's state directory")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--volumes", type=Path, help="where volume directories are made")
    where.add_argument("--node-volumes", type=Path, help="a directory per node; volumes under <node>/volumes")
    p.add_argument("--server", default="https://127.0.0.1:6443")
    p.add_argument("--provisioner", default="localkube.local/hostpath")
    p.add_argument("--storage-class", default="standard")
    a = p.parse_args()
    volumes = (a.volumes or a.node_volumes).resolve()
    per_node = a.node_volumes is not None
    prov = Provisioner(Api(a.server, a.state / "pki"), volumes, a.storage_class, a.provisioner, per_node)
    changed = threading.Event()
    claims = Watched(prov.api, "/api/v1/persistentvolumeclaims", changed)
    volumes_seen = Watched(prov.api, "/api/v1/persistentvolumes", changed)
    for watched in (claims, volumes_seen):
        watched.start()
    ready = a.state / "run" / "provisioner.ready"
    reported = ""
    while True:
        changed.wait(1)
        time.sleep(0.2)  # one pass for a burst of events, at most five passes a second
        changed.clear()
        error = claims.error or volumes_seen.error
        if error != reported:
            log(f"watch failed (listing again every second): {error}" if error else "watching again")
            reported = error
        if not (claims.listed.is_set() and volumes_seen.listed.is_set()):
            continue
        try:
            prov.sync(claims.snapshot(), volumes_seen.snapshot())
        except (OSError, ValueError, KeyError) as e:
            log(f"sync failed (retrying): {e}")
        if not ready.exists():
            ready.touch()
            log(f"provisioning class {a.storage_class} into {volumes}")


if __name__ == "__main__":
    sys.exit(main())
