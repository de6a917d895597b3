"""Backups across a major upgrade (backup.generations, docs/major-upgrades.md): the new major archives to a
generation of its own from its first start, gets a first base backup, and the generations are written to
the store for restores that find the cluster gone; a restored cluster reads the generation of its source's
backups that holds its target."""

from __future__ import annotations

import datetime as dt
import json
import logging

from lightkube.core.exceptions import ApiError

from pg_operator.backup import generations
from pg_operator.backup.from_spec import archive_settings, recovery_source
from pg_operator.controller import backup_kinds
from pg_operator.controller.kube_api import PostgresClusterResource
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.major_upgrade_plane import UpgradePlane
from pg_operator.controller.store_client import StoreError, put_object, read_object, s3_access, store_access
from pg_operator.orchestration.major_upgrade_state import UpgradeState
from pg_operator.orchestration.major_upgrade_views import with_archive_server, with_recovery_server

log = logging.getLogger(__name__)


def follow_generation(ctx: ReconcileContext, state: UpgradeState | None) -> None:
    """Every child is built with the server name of the generation the held major archives to."""
    if ctx.cluster.spec.backup is None:
        return
    gens = generations.of_cluster(ctx.body)
    if not gens and state is not None and state.old_major:
        gens = generations.first(ctx.name, state.old_major)
    server = generations.for_major(gens, ctx.name, ctx.cluster.spec.version)
    ctx.cluster = with_archive_server(ctx.cluster, server)


def started_generations(
    ctx: ReconcileContext, state: UpgradeState
) -> tuple[dict[str, str], list[generations.Generation]]:
    """With backups: the generations once the new major archives to its own (from its first start on),
    as the annotation to save with the state that starts it."""
    if ctx.cluster.spec.backup is None or state.writes_stopped is None:
        return {}, []
    since = dt.datetime.fromtimestamp(state.writes_stopped, dt.UTC)
    gens = generations.started(generations.of_cluster(ctx.body), ctx.name, state.old_major, state.new_major,
                               since)  # fmt: skip
    return {generations.ANNOTATION: generations.dump(gens)}, gens


async def announce_generation(
    plane: UpgradePlane, ctx: ReconcileContext, gens: list[generations.Generation]
) -> None:
    if not gens or ctx.cluster.spec.backup is None:
        return
    old, new = gens[-2], gens[-1]
    prefix = archive_settings(ctx.cluster.spec.backup, new.server_name).store.prefix
    await plane.record(ctx, "Normal", "BackupGenerationStarted",
        f"PostgreSQL {new.major} archives to server {new.server_name} (s3 prefix {prefix}) from its first "
        f"start; a restore to a time before {new.since} reads PostgreSQL {old.major}'s backups (server "
        f"{old.server_name}); Backup {generations.base_backup_name(new)} follows once it takes writes",
    )  # fmt: skip


async def base_backup(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> str:
    """The new generation's first base backup: a Backup object of the cluster, so it runs like any other
    (on a streaming replica when there is one, restart-safe, reported in its status and in
    LastBackupSucceeded, kept by retention)."""
    gens = generations.of_cluster(ctx.body) or generations.first(ctx.name, state.old_major)
    current = generations.Generation(generations.for_major(gens, ctx.name, state.new_major), state.new_major)
    body = generations.base_backup_object(ctx.namespace, ctx.name, ctx.cluster.uid, current)
    assert backup_kinds.BackupResource  # importing backup_kinds registers the Backup kind for create_dict
    try:
        await plane.api.create_dict(body)
    except ApiError as exc:
        if exc.status.code != 409:
            log.warning(
                "%s/%s: could not create the new generation's Backup: %s", ctx.namespace, ctx.name, exc
            )
            raise
    ctx.writes += 1
    return str(body["metadata"]["name"])


async def store_generations(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> UpgradeState:
    """The generations file in the first generation's prefix, for restores that find the cluster gone
    (written once per upgrade; a failing store is reported and asked again on the next reconcile)."""
    config = ctx.cluster.spec.backup
    if config is None or state.generations_stored == state.new_major:
        return state
    gens = generations.of_cluster(ctx.body)
    if len(gens) < 2 or gens[-1].major != state.new_major:
        return state  # the cache does not show the switch yet
    store = archive_settings(config, gens[0].server_name).store
    try:
        access = await store_access(plane.api, ctx.namespace, config, store, cluster=ctx.name)
        await put_object(
            access, generations.store_key(store.prefix), generations.store_document(ctx.name, gens)
        )
    except StoreError as exc:
        ctx.report(("BackupGenerationsUnrecorded", f"the generations file under {store.prefix} could not be "
                                                   f"written: {exc}"))  # fmt: skip
        ctx.again_in(30)
        return state
    stored = state.with_(generations_stored=state.new_major)
    await plane.save(ctx, stored)
    return stored


async def recovery_generation(plane: UpgradePlane, ctx: ReconcileContext) -> None:
    """A restored cluster reads the generation of its source's backups that holds the target, from the
    source's generations file (before its first instance starts; a source never upgraded with
    backups has none: its own name). The data runs the major it was backed up with, so a spec.version
    that differs is refused (the StatefulSet waits while a problem is reported)."""
    recovery = ctx.cluster.spec.bootstrap.recovery
    assert recovery is not None
    memory = plane.remembered(ctx)
    chosen = generations.recovery_generation(ctx.body) or memory.recovery
    if chosen is None:
        if ctx.statefulset is not None:
            return  # restored before generations existed: the source's own name
        chosen = await choose_recovery_generation(plane, ctx)
        if chosen is None:
            return
    if ctx.statefulset is None:
        refused = generations.major_mismatch(chosen, ctx.cluster.spec.version, recovery.source.cluster_name)
        if refused is not None:
            ctx.report(("RecoveryMajorMismatch", refused))
            return
    ctx.cluster = with_recovery_server(ctx.cluster, chosen.server_name)


async def choose_recovery_generation(
    plane: UpgradePlane, ctx: ReconcileContext
) -> generations.Generation | None:
    """Read the source's generations file, choose by the target and record the choice on the cluster;
    None when the store could not be read (reported, asked again)."""
    recovery = ctx.cluster.spec.bootstrap.recovery
    assert recovery is not None
    source = recovery_source(recovery)
    try:
        access = await s3_access(plane.api, ctx.namespace, recovery.source.s3, source, cluster=ctx.name,
                                 recovery=True)  # fmt: skip
        raw = await read_object(access, generations.store_key(source.prefix))
        gens = generations.parse(raw, f"{source.prefix}{generations.STORE_FILE}")
    except (StoreError, ValueError) as exc:
        ctx.report(("RecoverySourceUnreadable", f"the generations of {recovery.source.cluster_name}'s "
                                                f"backups could not be read: {exc}"))  # fmt: skip
        ctx.again_in(15)
        return None
    gens = gens or generations.first(recovery.source.cluster_name, ctx.cluster.spec.version)
    chosen = generations.for_target(
        gens, generations.target_time_of(recovery.target_time, recovery.backup_id)
    )
    plane.remembered(ctx).recovery = chosen
    record = json.dumps(chosen.to_mapping(), sort_keys=True)
    patch = {"metadata": {"annotations": {generations.RECOVERY_ANNOTATION: record}}}
    await plane.api.merge_patch(PostgresClusterResource, ctx.name, ctx.namespace, patch)
    ctx.writes += 1
    if len(gens) > 1:
        await plane.record(ctx, "Normal", "RecoveryGenerationChosen",
            f"restoring from server {chosen.server_name} of {recovery.source.cluster_name}'s backups "
            f"(PostgreSQL {chosen.major}), the generation that holds the target",
        )  # fmt: skip
    return chosen
