"""An operator pulling from a registry of its own (`--postgres-image-repository`,
`--pooler-image-repository`, `--image-pull-secrets`), on the kwok cluster: the StatefulSet and the
pooler's Deployment name those images and Secrets, and so do the pods the controllers make from them; a
cluster may pin a version of that repository in spec.image, but not the default local one (the
allow-list follows the configured repository)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.kube import apply, condition, get_or_none, make_namespace
from harness.objects import cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.waiting import wait_until
from pg_operator.images import BUILT_VERSIONS

pytestmark = pytest.mark.integration

REGISTRY = "registry.example.com:5000/db"
PULL_SECRETS = [{"name": "regcred"}, {"name": "mirror-cred"}]
OPERATOR = OperatorSpec("image-registry", (
    f"--postgres-image-repository={REGISTRY}/postgres", f"--pooler-image-repository={REGISTRY}/operator",
    "--pooler-image-tag=0.1.0", "--image-pull-secrets=regcred,mirror-cred",
))  # fmt: skip


def pod_spec(kube: Any, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    obj = get_or_none(kube, kind, name, "-n", ns)
    if obj is None:
        return None
    spec: dict[str, Any] = obj["spec"]["template"]["spec"] if kind != "pod" else obj["spec"]
    return spec


def test_every_pod_names_the_registry_and_its_pull_secrets(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "registry")
    try:
        apply(kube, cluster("pulled-db", ns, replicas=1, pooler={"instances": 1}))
        sts = wait_until(
            "pulled-db's StatefulSet", lambda: pod_spec(kube, "statefulset", "pulled-db", ns), 60
        )
        assert sts["containers"][0]["image"] == f"{REGISTRY}/postgres:{BUILT_VERSIONS['16'][0]}"
        assert sts["imagePullSecrets"] == PULL_SECRETS
        # The StatefulSet controller's pod (Running on a kwok node) carries them as the kubelet needs.
        pod = wait_until("pulled-db-0", lambda: pod_spec(kube, "pod", "pulled-db-0", ns), 60)
        assert pod["imagePullSecrets"] == PULL_SECRETS
        assert pod["containers"][0]["image"].startswith(f"{REGISTRY}/postgres:")
        pooler = wait_until("the pooler's Deployment",
                            lambda: pod_spec(kube, "deployment", "pulled-db-pooler-rw", ns), 120)  # fmt: skip
        assert pooler["containers"][0]["image"] == f"{REGISTRY}/operator:0.1.0"
        assert pooler["imagePullSecrets"] == PULL_SECRETS

        # spec.image may pin another version of the configured repository …
        pinned = f"{REGISTRY}/postgres:16.13"
        apply(kube, cluster("pinned-db", ns, replicas=1, image=pinned))
        sts = wait_until(
            "pinned-db's StatefulSet", lambda: pod_spec(kube, "statefulset", "pinned-db", ns), 60
        )
        assert sts["containers"][0]["image"] == pinned and sts["imagePullSecrets"] == PULL_SECRETS
        # … but no longer the local default repository: the allow-list is the configured one.
        apply(kube, cluster("local-db", ns, replicas=1, image="localhost/pg-operator/postgres:16.13"))

        def degraded() -> dict[str, Any]:
            return dict(condition(get_or_none(kube, "pgc", "local-db", "-n", ns), "Degraded"))

        refusal = wait_until("local-db refused", lambda: degraded().get("reason") == "ImageNotAllowed"
                             and degraded(), 60)  # fmt: skip
        assert f"allowed: {REGISTRY}/postgres" in refusal["message"]
        assert get_or_none(kube, "statefulset", "local-db", "-n", ns) is None
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")
