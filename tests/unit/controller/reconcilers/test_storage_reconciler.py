"""The storage sub-reconciler on stand-ins (no cluster): a data volume smaller than spec.storage is grown
once; a growth the API server refuses (the class cannot expand) is reported, and keeps being reported on
the passes in between while the same write is held back, instead of flapping to healthy."""

from __future__ import annotations

import asyncio

from lightkube.core.exceptions import ApiError
from lightkube.models import meta_v1
from reconciler_fakes import UID, FakeApi, context, owned

from harness.objects import cluster_model
from pg_operator.controller.reconcilers.storage import StorageReconciler
from pg_operator.controller.writes import WriteMemo

GROWN = cluster_model(uid=UID, storage="30Gi")


def claim(name: str, size: str) -> dict[str, object]:
    return owned("PersistentVolumeClaim", name, spec={"resources": {"requests": {"storage": size}}})


def refusal(message: str) -> ApiError:
    return ApiError(status=meta_v1.Status.from_dict({"code": 403, "message": message, "reason": "Forbidden"}))


def test_only_the_smaller_data_volumes_are_grown_and_only_once() -> None:
    api, memo = FakeApi(), WriteMemo()
    storage = StorageReconciler(api, memo)  # type: ignore[arg-type]
    claims = [claim("data-orders-db-0", "20Gi"), claim("data-orders-db-1", "30Gi"), claim("scratch", "1Gi")]
    assert asyncio.run(storage.follow_up(context(claims, cluster=GROWN))) == 1
    assert api.patched == [("data-orders-db-0", {"spec": {"resources": {"requests": {"storage": "30Gi"}}}})]
    # The next pass comes before the cache shows the claim's new version: not written again.
    assert asyncio.run(storage.follow_up(context(claims, cluster=GROWN))) == 0
    assert len(api.patched) == 1


def test_a_refused_growth_is_reported_on_every_pass_while_it_is_held_back() -> None:
    api, memo = FakeApi(), WriteMemo()
    api.refuse_patch = refusal("storageclass does not allow volume expansion")
    storage = StorageReconciler(api, memo)  # type: ignore[arg-type]
    claims = [claim("data-orders-db-0", "20Gi")]
    for _ in range(2):
        ctx = context(claims, cluster=GROWN)
        asyncio.run(storage.follow_up(ctx))
        assert ctx.problem is not None and ctx.problem[0] == "StorageResizeRefused"
        assert "data-orders-db-0" in ctx.problem[1] and "expansion" in ctx.problem[1]
    # Grown by hand meanwhile: nothing to write, nothing to report.
    ctx = context([claim("data-orders-db-0", "30Gi")], cluster=GROWN)
    assert asyncio.run(storage.follow_up(ctx)) == 0 and ctx.problem is None
