"""The StorageClass check where the operator may not read StorageClasses (a namespaced install): it is
skipped (no Degraded cluster for it), and nothing of the operator lists or watches them."""

from __future__ import annotations

from typing import Any

from lightkube.models.authorization_v1 import SubjectAccessReviewStatus
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

from pg_operator.controller.cache import Cache, Snapshot, watched_kinds
from pg_operator.controller.loop import ReconcileLoop, Result
from pg_operator.controller.reconcilers.storage import (
    storage_class_problem,
    storage_class_review,
    storage_classes_readable,
)
from pg_operator.controller.wakeups import Wakeups, feeds
from pg_operator.specs import MANAGED_KINDS


def cluster_body() -> dict[str, Any]:
    return {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "shop", "uid": "c1", "resourceVersion": "1"},
            "spec": {"replicas": 1, "storageClassName": "fast"}}  # fmt: skip


def test_a_missing_class_is_reported_only_when_the_classes_are_known() -> None:
    spec = {"storageClassName": "fast"}
    problem = storage_class_problem(spec, Snapshot(None, storage_classes=frozenset({"slow"}),
                                                   storage_classes_known=True))  # fmt: skip
    assert problem is not None and problem[0] == "StorageClassNotFound" and "'fast'" in problem[1]
    assert storage_class_problem(spec, Snapshot(None, storage_classes_known=False)) is None
    assert storage_class_problem({}, Snapshot(None, storage_classes_known=True)) is None


def test_a_cache_that_may_not_read_classes_never_claims_to_know_them() -> None:
    cache = Cache(watched_kinds(MANAGED_KINDS))
    cache.observe(cluster_body(), None)
    assert cache.snapshot(("shop", "db")).storage_classes_known  # a hand-filled cache is synced
    cache.storage_classes_readable = False
    snap = cache.snapshot(("shop", "db"))
    assert not snap.storage_classes_known and snap.storage_classes == frozenset()
    assert storage_class_problem(cluster_body()["spec"], snap) is None


class Idle:
    async def reconcile(self, key: tuple[str, str]) -> Result:
        return Result()


def watched_resources(storage_classes: bool) -> set[str]:
    loop: ReconcileLoop[tuple[str, str]] = ReconcileLoop(Idle(), status_delay=1.0)
    kinds = watched_kinds(MANAGED_KINDS)
    return {f.kind.plural for f in feeds(Wakeups(loop, Cache(kinds)), kinds, storage_classes=storage_classes)}


def test_without_the_permission_no_storage_class_is_listed_or_watched() -> None:
    assert "storageclasses" in watched_resources(True)
    without = watched_resources(False)
    assert "storageclasses" not in without
    assert {"pods", "secrets", "configmaps", "postgresclusters"} <= without


def test_the_review_asks_for_cluster_wide_storage_classes() -> None:
    review = storage_class_review("watch")
    attrs = review.spec.resourceAttributes
    assert attrs is not None
    assert (attrs.group, attrs.resource, attrs.verb, attrs.namespace) == (
        "storage.k8s.io",
        "storageclasses",
        "watch",
        None,
    )


class Authorizer:
    """Answers SelfSubjectAccessReviews from a set of allowed verbs (the API server's part)."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.asked: list[str] = []

    async def create(self, review: SelfSubjectAccessReview) -> SelfSubjectAccessReview:
        attrs = review.spec.resourceAttributes
        assert attrs is not None and attrs.verb is not None
        self.asked.append(attrs.verb)
        review.status = SubjectAccessReviewStatus(allowed=attrs.verb in self.allowed)
        return review


async def test_readable_only_with_both_list_and_watch() -> None:
    assert await storage_classes_readable(Authorizer({"get", "list", "watch"}))  # type: ignore[arg-type]
    only_list = Authorizer({"list"})
    assert not await storage_classes_readable(only_list)  # type: ignore[arg-type]
    assert only_list.asked == ["list", "watch"]
    nothing = Authorizer(set())
    assert not await storage_classes_readable(nothing)  # type: ignore[arg-type]
    assert nothing.asked == ["list"]
