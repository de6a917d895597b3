"""The pooler sub-reconciler says why its pods are not ready: while fewer are ready than wanted it lists
them whole, and one that cannot run makes the Pooler condition False with the cause (one Warning per
cause); once they are ready it lists nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from harness.objects import cluster_model
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.pooler import PoolerReconciler
from pg_operator.controller.writes import WriteMemo

IMAGE = "localhost/pg-operator/operator:0.0.0-missing"


class ListingApi:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.listed = 0

    async def list_page(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        assert path == "/api/v1/namespaces/shop/pods" and params == {
            "labelSelector": "db.example.com/pooler=orders-db"
        }
        self.listed += 1
        return {"items": self.pods}


class RecordedEvents:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    async def record(self, _obj: Any, kind: str, reason: str, message: str) -> bool:
        self.posted.append((kind, reason, message))
        return True


def pooler_pod(name: str, waiting: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop", "labels": {"db.example.com/pooler": "orders-db"}},
        "spec": {"containers": [{"name": "pgbouncer", "image": IMAGE}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "pgbouncer",
                    "restartCount": 0,
                    "state": {"waiting": {"reason": waiting, "message": f'Back-off pulling image "{IMAGE}"'}},
                }
            ],
        },
    }


def deployment(ready: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "orders-db-pooler-rw", "generation": 1},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": ready},
    }


def pass_with(reconciler: PoolerReconciler, ready: int) -> dict[str, Any]:
    cluster = cluster_model(pooler={"instances": 2})
    body = {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u"}}
    ctx = ReconcileContext(
        body, cluster, Snapshot(None, {("apps/v1", "Deployment"): [deployment(ready)]}), None
    )
    asyncio.run(reconciler.act(ctx))
    status: dict[str, Any] = {"conditions": []}
    reconciler.status(ctx, status)
    return next(c for c in status["conditions"] if c["type"] == "Pooler")


def test_a_pooler_pod_that_cannot_pull_its_image_is_named_in_the_pooler_condition() -> None:
    pods = [
        pooler_pod("orders-db-pooler-rw-5d9f-abcde", "ImagePullBackOff"),
        pooler_pod("someone-elses-pod", "ErrImagePull"),
    ]
    api, events = ListingApi(pods), RecordedEvents()
    reconciler = PoolerReconciler(api, WriteMemo(), events, None)  # type: ignore[arg-type]
    condition = pass_with(reconciler, ready=0)
    assert (condition["status"], condition["reason"]) == ("False", "ImagePullFailed")
    assert condition["message"].startswith(
        f'pod orders-db-pooler-rw-5d9f-abcde container pgbouncer cannot pull image "{IMAGE}"'
    )
    assert "someone-elses-pod" not in condition["message"]
    pass_with(reconciler, ready=0)
    assert [e[1] for e in events.posted] == ["ImagePullFailed"]  # once per cause, not per pass
    assert api.listed == 2
    condition = pass_with(reconciler, ready=2)
    assert condition["reason"] != "ImagePullFailed" and api.listed == 2  # ready: nothing listed
