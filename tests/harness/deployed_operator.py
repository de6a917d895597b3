"""The operator as a user installs it (the e2e tier and its benchmarks): images built and imported into
the full profile's node, then `kubectl apply -k deploy/`; and the user's example cluster."""

from __future__ import annotations

from typing import Any

import yaml
from localkube.images.containerd import ensure_images

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


def install_operator(kube: Kube) -> None:
    """What a user does (kubectl apply -k deploy/), after building and importing the images."""
    ensure_images(kube.ctx, [default_image("16"), image_for("16.13"), operator_image()])
    kube.kubectl("apply", "-k", str(REPO / "deploy"))
    kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                 "--timeout=300s", timeout=320)  # fmt: skip
