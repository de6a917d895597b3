"""A stuck cluster says why (full profile): a one-instance cluster whose spec.image cannot be pulled is
Degraded `ImagePullFailed` naming the pod, the container and the image, with one Warning Event for the
cause however often the kubelet retries, and `kubectl pgc status` shows it; once spec.image is set back
the operator replaces the stuck pod and the cluster becomes Ready with Degraded False.

The image is a tag that was never built in the operator's own repository: the install's
`--allowed-image-repositories` admits it (a repository outside the list is refused before any pod
exists, a different problem), and no registry serves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.pgcluster import SMALL, status, wait_serving
from harness.waiting import wait_until
from pg_operator.images import IMAGE_REPOSITORY, default_image

NS, NAME = "stuck", "stuck-db"
MISSING = f"{IMAGE_REPOSITORY}:16.99-never-built"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def kube(operator: Kube) -> Iterator[Kube]:
    operator.kubectl("create", "namespace", NS)
    yield operator
    operator.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")


def degraded(kube: Kube) -> dict[str, Any] | None:
    for c in status(kube, NS, NAME).get("conditions") or []:
        if c.get("type") == "Degraded" and c.get("status") == "True":
            return dict(c)
    return None


def warnings(kube: Kube, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=PostgresCluster,involvedObject.name={NAME},reason={reason}"
    return list(get_json(kube, "events", "-n", NS, "--field-selector", selector)["items"])


def waiting_reason(kube: Kube) -> str:
    pod = get_json(kube, "pod", f"{NAME}-0", "-n", NS)
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        return str(((c.get("state") or {}).get("waiting") or {}).get("reason") or "")
    return ""


def pgc_status(kube: Kube) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{kube.ctx.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("KUBECONFIG", None)
    command = [str(BIN / "kubectl-pgc"), "--kubeconfig", kube.kubeconfig, "-n", NS, "status", NAME]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_an_image_that_cannot_be_pulled_is_degraded_naming_it_then_ready_once_fixed(kube: Kube) -> None:
    body = cluster(NAME, NS, replicas=1, resources=SMALL, image=MISSING)
    started = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))

    def names_the_image() -> dict[str, Any] | None:
        found = degraded(kube)
        return found if found and found.get("reason") == "ImagePullFailed" else None

    condition = wait_until("Degraded ImagePullFailed", names_the_image, timeout=120, interval=1)
    to_degraded = time.monotonic() - started
    print(json.dumps({"measure": "stuck_image_to_degraded", "seconds": round(to_degraded, 1), "goal_s": 30}),
          flush=True)  # fmt: skip
    message = str(condition["message"])
    assert f'pod {NAME}-0 container postgres cannot pull image "{MISSING}": ' in message, message
    assert status(kube, NS, NAME)["phase"] == "Degraded: ImagePullFailed"

    screen = pgc_status(kube)
    print(screen.stdout)
    assert screen.returncode != 0  # not ready
    assert f"Stuck      ImagePullFailed: pod {NAME}-0 container postgres" in screen.stdout, screen.stdout

    # The kubelet retries (ErrImagePull, then ImagePullBackOff, and again), each change waking the cluster:
    # still one Warning for the cause.
    seen = waiting_reason(kube)
    wait_until("the kubelet to retry the pull", lambda: waiting_reason(kube) not in ("", seen), 90, 1)
    retold = lambda: (degraded(kube) or {}).get("message") not in (None, message)  # noqa: E731
    wait_until("the status to say the retry", retold, 30, 1)
    told = warnings(kube, "ImagePullFailed")
    assert len(told) == 1 and sum(int(e.get("count") or 1) for e in told) == 1, told
    assert MISSING in told[0]["message"]

    fixed = time.monotonic()
    patch = {"spec": {"image": default_image("16")}}
    kube.kubectl("-n", NS, "patch", "pgc", NAME, "--type=merge", "-p", json.dumps(patch))
    wait_serving(kube, NS, NAME, 1, 600)
    wait_until("Degraded to clear", lambda: degraded(kube) is None, 60)
    took = round(time.monotonic() - fixed, 1)
    print(json.dumps({"measure": "stuck_image_fixed_to_ready", "seconds": took}), flush=True)
    assert len(warnings(kube, "ImagePullFailed")) == 1
    assert warnings(kube, "Recovered"), "no Recovered Event once Degraded cleared"
    assert "Stuck" not in pgc_status(kube).stdout
