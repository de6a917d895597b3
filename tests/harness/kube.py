"""kubectl-like helpers over anything with `.kubectl(...)`: the session's `Kube` (harness.local_cluster)
or `ExternalKube` (another API server, by kubeconfig)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Protocol


class KubectlLike(Protocol):
    """What the helpers need: a kubeconfig and a kubectl that raises AssertionError on failure."""

    kubeconfig: str

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


class ExternalKube:
    """A cluster given by a kubeconfig (e.g. $PGOP_TEST_KUBECONFIG, or a benchmark's), with the local
    cluster's kubectl."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_bin = os.environ.get(
            "PGOP_KUBECTL", str(Path.home() / ".cache/pg-operator/current/kubectl")
        )

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
        return res


def wait_established(kube: KubectlLike, *crds: str, timeout: float = 60) -> None:
    """`kubectl wait --for=condition=Established` on CRDs (`crd/<name>`), tolerating kubectl's race with a
    CRD just created: until the API server writes its first status, `wait` fails at once with
    ".status.conditions accessor error" instead of waiting."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(1, int(deadline - time.monotonic()))
        res = kube.kubectl("wait", "--for=condition=Established", f"--timeout={left}s", *crds, check=False)
        if res.returncode == 0:
            return
        if "accessor error" not in res.stderr or time.monotonic() >= deadline:
            raise AssertionError(f"kubectl wait for {' '.join(crds)} to be Established failed:\n{res.stderr}")
        time.sleep(0.2)


def get_json(kube: KubectlLike, *args: str) -> Any:
    """`kubectl get ARGS -o json`, parsed."""
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def get_or_none(kube: KubectlLike, *args: str) -> Any:
    """Like get_json, None for an object that does not exist."""
    res = kube.kubectl("get", *args, "-o", "json", check=False)
    if res.returncode != 0:
        if "NotFound" in res.stderr:
            return None
        raise AssertionError(res.stderr)
    return json.loads(res.stdout)


def apply(kube: KubectlLike, obj: Any) -> None:
    """Server-side apply of one object (a dict or its text) under the field manager "test"."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    kube.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=text)


def apply_objects(kube: KubectlLike, *objects: dict[str, Any]) -> None:
    """Client-side apply of several objects as one List."""
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def make_namespace(kube: KubectlLike, prefix: str) -> str:
    """A new namespace `<prefix>-<6 hex digits>`."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    return ns


def condition(obj: Any, kind: str) -> dict[str, Any]:
    """The status condition of type `kind` of an object (a dict), {} when it has none."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def events(kube: KubectlLike, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """The Events about one object."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    return list(get_json(kube, "events", "-n", namespace, "--field-selector", selector)["items"])


def events_for(kube: KubectlLike, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events about one PostgresCluster."""
    return events(kube, namespace, "PostgresCluster", name)
