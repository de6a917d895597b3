"""Which store prefix the backup reconcilers use for a cluster (its current generation), and which ones
the onDelete: delete cleanup empties (every generation), from plain cluster objects."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pg_operator.backup import generations
from pg_operator.controller.backup_reconcilers.cluster_backups import ClusterBackupReconciler
from pg_operator.controller.backup_reconcilers.shared import backup_config, store_of, stores_of

BACKUP = {"s3": {"bucket": "backups", "path": "prod", "credentials": {"secretName": "s3"}}}


def cluster(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "orders-db", "namespace": "shop", "uid": "u1"}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"version": "17", "backup": BACKUP}}


def test_a_never_upgraded_cluster_uses_its_own_name() -> None:
    body = cluster()
    config = backup_config(body)
    assert config is not None
    assert store_of(body, config).prefix == "prod/orders-db/"
    assert [s.prefix for s in stores_of(body, config)] == ["prod/orders-db/"]


def test_after_an_upgrade_the_current_generation_and_every_generation_for_the_cleanup() -> None:
    when = dt.datetime(2026, 12, 2, 22, 0, tzinfo=dt.UTC)
    gens = generations.started([], "orders-db", "16", "17", when)
    body = cluster({generations.ANNOTATION: generations.dump(gens)})
    config = backup_config(body)
    assert config is not None
    assert store_of(body, config).prefix == "prod/orders-db-pg17/"
    assert [s.prefix for s in stores_of(body, config)] == ["prod/orders-db/", "prod/orders-db-pg17/"]


def test_the_status_lists_the_generations_once_there_is_a_record() -> None:
    assert "generations" not in ClusterBackupReconciler._summary(cluster(), None, None, [])
    when = dt.datetime(2026, 12, 2, 22, 0, tzinfo=dt.UTC)
    gens = generations.started([], "orders-db", "16", "17", when)
    body = cluster({generations.ANNOTATION: generations.dump(gens)})
    assert ClusterBackupReconciler._summary(body, None, None, [])["generations"] == [
        {"serverName": "orders-db", "major": "16"},
        {"serverName": "orders-db-pg17", "major": "17", "since": "2026-12-02T22:00:00.000000Z"},
    ]
