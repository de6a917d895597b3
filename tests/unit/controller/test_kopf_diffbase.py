"""The operator gives kopf an empty diff base; that is sound only while no handler detects changes."""

from __future__ import annotations

import inspect
from typing import Any, cast

import kopf

from pg_operator.controller.cache import Cache, watched_kinds
from pg_operator.controller.kopf_diffbase import EmptyDiffBase, change_detecting_handlers
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.controller.operator import kopf_settings
from pg_operator.controller.wakeups import Wakeups, build_registry
from pg_operator.specs import MANAGED_KINDS


def operator_registry() -> kopf.OperatorRegistry:
    kinds = watched_kinds(MANAGED_KINDS)
    # build_registry only closes over the controller; nothing here calls it.
    return build_registry(Wakeups(cast(ReconcileLoop, object()), Cache(kinds)), kinds)


def test_the_operator_registry_has_no_change_detecting_handler() -> None:
    assert change_detecting_handlers(operator_registry()) == []


def test_a_change_handler_is_found_by_its_id() -> None:
    registry = kopf.OperatorRegistry()

    def on_update(**_: Any) -> None: ...

    kopf.on.update("db.example.com", "v1alpha1", "postgresclusters", id="upd", registry=registry)(on_update)
    kopf.timer("db.example.com", "v1alpha1", "postgresclusters", id="tick", interval=5, registry=registry)(
        on_update
    )
    assert sorted(change_detecting_handlers(registry)) == ["tick", "upd"]


def test_the_settings_use_the_empty_diff_base_and_it_copies_nothing() -> None:
    storage = kopf_settings().persistence.diffbase_storage
    assert isinstance(storage, EmptyDiffBase)
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": [1]}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None


def test_event_handlers_are_coroutines_so_kopf_runs_them_without_its_thread_pool() -> None:
    handlers = operator_registry()._watching.get_all_handlers()
    assert len(handlers) >= 3
    assert [h.id for h in handlers if not inspect.iscoroutinefunction(h.fn)] == []


def test_the_registry_has_no_kopf_index_whose_gate_would_hold_every_listed_body() -> None:
    assert operator_registry()._indexing.get_all_handlers() == []
