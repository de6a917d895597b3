"""The operator as a user installs it (the e2e tier and its benchmarks): images built and imported into
the full profile's node, then the Helm chart charts/pg-operator (cluster-wide; the kubectl install from
deploy/ is proven by the namespaced-install module and the demo); and the user's example cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from localkube.images.containerd import ensure_images

from harness.kube import KubectlLike
from harness.local_cluster import Kube
from harness.paths import REPO
from pg_operator.images import default_image, image_for

OPERATOR_NAMESPACE = "pg-operator-system"
EXAMPLE_NAMESPACE, EXAMPLE = "shop", "orders-db"


def operator_image() -> str:
    for doc in yaml.safe_load_all((REPO / "deploy" / "operator" / "deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
            return str(next(c["image"] for c in containers if c["name"] == "operator"))
    raise AssertionError("deploy/operator/deployment.yaml has no Deployment")


CHART = REPO / "charts" / "pg-operator"
RELEASE = "pg-operator"  # with the chart's naming, the Deployment, ServiceAccount and RBAC are `pg-operator`


def helm(kube: Kube, *args: str, timeout: float = 360) -> subprocess.CompletedProcess[str]:
    """The helm binary built into the cache (localkube/build-binaries.sh), on `kube`'s cluster."""
    cmd = [kube.ctx.binary("helm"), "--kubeconfig", kube.kubeconfig, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


# The e2e tier's S3 emulator (harness/s3.py, moto) speaks plain HTTP: the installed operator allows it.
INSECURE_STORES = ("--allow-insecure-object-stores",)
# The e2e tier's flags (its single-node and multi-node clusters alike): a CA rotation trusts both CAs for
# 20 s (default 90 s), as the tests' writers re-read the app Secret's ca.crt every few seconds.
E2E_OPERATOR_ARGS = ("--ca-trust-period=20s",)


def install_operator(kube: Kube, extra_args: Sequence[str] = ()) -> None:
    """What a user does with the chart (docs/install.md), after building and importing the images: the
    namespace with the restricted Pod Security level, then `helm upgrade --install` of the cluster-wide
    chart with the locally built image (an install on a fresh cluster; on a reused one it upgrades, takes
    over objects an earlier `kubectl apply -k deploy/` made, and applies the chart's CRDs first, as Helm
    never upgrades them). `extra_args`: more flags for `pg-operator run` (the chart's extraArgs)."""
    image = operator_image()
    ensure_images(kube.ctx, [default_image("16"), image_for("16.13"), image])
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": OPERATOR_NAMESPACE,
                              "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}  # fmt: skip
    kube.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=yaml.safe_dump(namespace))
    if kube.kubectl("get", "crd", "postgresclusters.db.example.com", check=False).returncode == 0:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    repository, _, tag = image.rpartition(":")
    helm(kube, "upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
         "--take-ownership", "--set-string", f"image.repository={repository},image.tag={tag}",
         "--set-json", f"extraArgs={json.dumps([*INSECURE_STORES, *extra_args])}")  # fmt: skip
    kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                 "--timeout=300s", timeout=320)  # fmt: skip


# --- The namespaced install (deploy/namespaced/) ---------------------------------------------------

NAMESPACED_EXAMPLE = "shop"  # the watched namespace the overlay ships with (watch/shop)


def namespaced_overlay(kube: KubectlLike, work: Path, watched: Sequence[str]) -> list[dict[str, Any]]:
    """deploy/namespaced/ rendered to watch `watched`, edited as docs/install.md tells a user: a copy of
    deploy/ in `work`, one component per namespace made from watch/shop, the components list replaced."""
    root = work / "deploy"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(REPO / "deploy", root)
    overlay = root / "namespaced"
    example = overlay / "watch" / NAMESPACED_EXAMPLE
    for ns in watched:
        if ns != NAMESPACED_EXAMPLE:
            shutil.copytree(example, overlay / "watch" / ns)
            for path in (overlay / "watch" / ns).rglob("kustomization.yaml"):
                path.write_text(path.read_text().replace(NAMESPACED_EXAMPLE, ns))
    kustomization = overlay / "kustomization.yaml"
    listed = f"  - watch/{NAMESPACED_EXAMPLE}\n"
    text = kustomization.read_text()
    assert text.count(listed) == 1, "deploy/namespaced/kustomization.yaml no longer lists watch/shop once"
    kustomization.write_text(text.replace(listed, "".join(f"  - watch/{ns}\n" for ns in watched)))
    rendered = kube.kubectl("kustomize", str(overlay)).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def operator_namespaces(objects: Sequence[dict[str, Any]]) -> list[str]:
    """The namespaces the rendered Deployment tells the operator to watch (its --namespace flags)."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    args = next(c for c in containers if c["name"] == "operator")["args"]
    return [a.split("=", 1)[1] for a in args if a.startswith("--namespace=")]
