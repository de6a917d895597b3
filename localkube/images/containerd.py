"""Importing built images into the running node's containerd (namespace k8s.io), where the kubelet
finds them: nothing is pulled, every image is imported."""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from localkube.common import ClusterError, Context
from localkube.images.builder import build
from localkube.images.spec import spec_for_ref
from localkube.topology import runtime_addresses


def _manifest_digest(tar: Path) -> str:
    with tarfile.open(tar) as t:
        member = t.extractfile("index.json")
        assert member is not None
        return str(json.load(member)["manifests"][0]["digest"])


def imported_digest(address: str, ref: str) -> str | None:
    res = subprocess.run(
        ["ctr", "--address", address, "-n", "k8s.io", "images", "ls", f"name=={ref}"],
        capture_output=True,
        text=True,
    )
    for line in res.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[0] == ref:
            return cols[2]
    return None


def import_image(address: str, tar: Path, ref: str) -> None:
    """ctr-import the OCI tar into the k8s.io namespace unless that exact image is there already."""
    if imported_digest(address, ref) == _manifest_digest(tar):
        return
    res = subprocess.run(
        ["ctr", "--address", address, "-n", "k8s.io", "images", "import", str(tar)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise ClusterError(f"ctr image import {tar} failed: {res.stderr.strip() or res.stdout.strip()}")
    if imported_digest(address, ref) is None:
        raise ClusterError(f"ctr imported {tar} but containerd has no image named {ref}")


def ensure_images(ctx: Context, names: Sequence[str]) -> None:
    """Build (cached) and import each image reference into every running node's containerd, e.g.
    ["localkube.local/base:bookworm", "localhost/pg-operator/postgres:16.15"]."""
    for ref in names:
        spec, args = spec_for_ref(ref)
        tar, _ = build(spec, args, ctx.cache)
        addresses = runtime_addresses(ctx)
        # One import per node's containerd (each unpacks into its own snapshots), side by side: the
        # unpacking waits on the disk as much as on a core.
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            for done in [pool.submit(import_image, address, tar, ref) for address in addresses]:
                done.result()
