"""Per-cluster memory in one place (controller/cluster_memory.py): every sub-reconciler keeps what it
remembers of a cluster in `ClusterMemory` stores, none forgets by hand, and a gone cluster leaves nothing
behind anywhere in the cluster reconciler."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pg_operator.controller.cache import Cache
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.reconcile import Reconciler
from pg_operator.controller.reconcilers import SubReconciler

KEY = ("shop", "orders-db")
OTHER = ("shop", "billing-db")
# Sub-reconcilers allowed a memory of their own (none).
NOT_YET: set[str] = set()


def reconciler() -> Reconciler:
    return Reconciler(None, Cache([]), Metrics(), EventRecorder(None, "test"))  # type: ignore[arg-type]


def holders(obj: object, seen: set[int] | None = None) -> list[object]:
    """obj and every RemembersClusters object it holds, at any depth."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    found = [obj]
    for value in vars(obj).values():
        if isinstance(value, RemembersClusters):
            found += holders(value, seen)
    return found


def fill(memory: ClusterMemory[Any], key: tuple[str, str]) -> None:
    """A value for the cluster in any store: its own default, or an empty set (what the stores without a
    default and with an `on_forget` hold)."""
    try:
        memory.of(key)
    except KeyError:
        memory.set(key, set())


def test_a_store_makes_drops_and_forgets_one_cluster_s_value() -> None:
    released: list[tuple[tuple[str, str], list[str]]] = []
    memory: ClusterMemory[list[str]] = ClusterMemory(list, on_forget=lambda k, v: released.append((k, v)))
    memory.of(KEY).append("told")
    memory.of(OTHER)
    assert memory.get(KEY) == ["told"] and len(memory) == 2
    assert memory.drop(OTHER) == [] and released == []  # the cluster lives on: nothing to release
    memory.forget(KEY)
    assert released == [(KEY, ["told"])] and len(memory) == 0
    memory.forget(KEY)  # twice is harmless
    assert released == [(KEY, ["told"])]
    with pytest.raises(KeyError):
        ClusterMemory[int]().of(KEY)  # no default: `of` does not invent one


def test_no_sub_reconciler_forgets_by_hand() -> None:
    overriding = sorted(
        type(r).__name__
        for r in reconciler().sub_reconcilers
        if type(r).forget is not SubReconciler.forget and type(r).__name__ not in NOT_YET
    )
    assert overriding == []


def test_no_sub_reconciler_keeps_a_dict_or_set_of_its_own() -> None:
    """Per-cluster memory as a plain dict would escape the framework's forget: every mapping or set a
    sub-reconciler (or a helper that remembers clusters) holds must be in a ClusterMemory."""
    plain = sorted(
        f"{type(h).__name__}.{name}"
        for r in reconciler().sub_reconcilers
        if type(r).__name__ not in NOT_YET
        for h in holders(r)
        for name, value in vars(h).items()
        if isinstance(value, dict | set)
    )
    assert plain == []


def test_every_sub_reconciler_declares_memory_the_framework_finds() -> None:
    """The walk finds stores on the sub-reconcilers and on the helpers they hold (an OncePerMessage, the
    settings changes, the certificate metrics, the loop waker)."""
    counts = {type(r).__name__: len(list(r.memories())) for r in reconciler().sub_reconcilers}
    assert counts["HighAvailabilityReconciler"] >= 3  # its own, the settings changes', the loop waker's
    assert counts["TlsReconciler"] >= 3  # its refusals, its Warnings, the expiry series
    # The drains sub-reconciler remembers nothing: each pass reports from the nodes in the snapshot.
    stateless = {"MajorUpgradeReconciler", "DrainsReconciler"}
    assert all(n >= 1 for name, n in counts.items() if name not in stateless)
    assert counts["DrainsReconciler"] == 0


def test_a_gone_cluster_leaves_nothing_behind() -> None:
    r = reconciler()
    stores = [m for h in (r, *r.sub_reconcilers) for m in h.memories()]
    for memory in stores:
        fill(memory, KEY)
        fill(memory, OTHER)
    assert all(KEY in m for m in stores)

    outcome = asyncio.run(r.reconcile(KEY))  # the cache holds no such cluster: it is gone

    assert outcome.gone
    assert [m for m in stores if KEY in m] == []
    assert all(OTHER in m for m in stores)  # another cluster's memory is untouched


def test_forgetting_releases_what_a_store_held() -> None:
    """The settings reader in flight is cancelled and the certificate expiry series removed."""
    r = reconciler()
    tls = next(s for s in r.sub_reconcilers if type(s).__name__ == "TlsReconciler")
    ha = next(s for s in r.sub_reconcilers if type(s).__name__ == "HighAvailabilityReconciler")
    import datetime as dt

    tls.metrics.set(KEY, {"ca": ("orders-db-ca", dt.datetime(2030, 1, 1, tzinfo=dt.UTC))})  # type: ignore[attr-defined]
    assert r.metrics.registry.get_sample_value(
        "pg_operator_certificate_expiry_timestamp_seconds",
        {"namespace": "shop", "cluster": "orders-db", "certificate": "ca", "secret": "orders-db-ca"},
    )

    async def gone_while_reading() -> bool:
        reader = asyncio.get_running_loop().create_task(asyncio.sleep(60))
        ha.settings._memory.of(KEY).reader = reader  # type: ignore[attr-defined]
        await r.reconcile(KEY)
        await asyncio.sleep(0)
        return reader.cancelled()

    assert asyncio.run(gone_while_reading())
    assert (
        r.metrics.registry.get_sample_value(
            "pg_operator_certificate_expiry_timestamp_seconds",
            {"namespace": "shop", "cluster": "orders-db", "certificate": "ca", "secret": "orders-db-ca"},
        )
        is None
    )
