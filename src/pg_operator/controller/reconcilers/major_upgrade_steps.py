"""The major upgrade's steps, one per phase (docs/major-upgrades.md). A pass runs the step of the phase the
upgrade is in; a step either waits (asks to be run again soon) or saves the state the transition table
(`orchestration/major_upgrade_state.py`) gives for what it found. Every step may run again after a reconcile
that failed half-way: each call below is safe to repeat.

  Checking            the new major's tree staged on the primary's volume (an ephemeral container of the
                      new image), then the live `pg_upgrade --check`; the cluster serves
  CheckFailed         pg_upgrade's reason reported; checked again after CHECK_RETRY_SECONDS
  Upgrading           the old major's WAL archived (with backups), Patroni paused on every member, the
                      primary stopped, then each replica once it replayed the primary's shutdown
                      checkpoint while the upgrade script runs on the primary; a failure rolls back
                      (RolledBack). Success: Patroni's `initialize` gets the new system identifier, caught-up
                      replicas are seeded from the primary, the others emptied (re-cloned)
  Starting            the StatefulSet at the new major (its pods recreated by the sub-reconciler's
                      follow-up), Patroni resumed, the new leader found
  ReplicasCatchingUp  every instance back and ready
  Analyzing           statistics, then the work directories removed: Done
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pg_operator.api.constants import PGDATA
from pg_operator.controller.pod_exec import PSQL_ARGV
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.major_upgrade_backups import (
    announce_generation,
    base_backup,
    started_generations,
)
from pg_operator.controller.reconcilers.major_upgrade_plane import UpgradePlane
from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration import major_upgrade_replicas as mur
from pg_operator.orchestration.instances import Instance
from pg_operator.orchestration.major_upgrade_state import (
    Outcome,
    Phase,
    UpgradeState,
    check_retry_in,
    new_primary,
    old_image_runs,
    outage_start,
    replicas_back,
    staging,
    upgrade_image,
    upgraded_system_identifier,
)
from pg_operator.orchestration.major_upgrade_views import at_major

POLL_SECONDS = 3.0
# While writes are stopped every second counts: the reconciles waiting on the instances poll faster.
OUTAGE_POLL_SECONDS = 1.0
PAUSE_POLL_SECONDS = 0.5
OLD_BIN = "/usr/lib/postgresql/current/bin"
# Before writes stop, the old major's current WAL segment must be archived within this many seconds.
ARCHIVE_WAIT_SECONDS = 120
# How long a replica may take to replay the primary's shutdown checkpoint before it is stopped anyway (and
# re-cloned): the primary's upgrade runs meanwhile, so a caught-up replica costs no outage.
REPLICA_CATCH_UP_SECONDS = 10

Step = Callable[[UpgradePlane, ReconcileContext, UpgradeState], Awaitable[None]]


def layout_of(state: UpgradeState) -> mu.Layout:
    return mu.Layout(old_bin=OLD_BIN, new_home=mu.staged_binaries(staging(state).tree))


# --- Checking, CheckFailed, RolledBack ---------------------------------------------------------------


async def checking(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    primary = plane.primary(ctx)
    if primary is None:
        ctx.again_in(POLL_SECONDS)
        return
    stage = staging(state)
    staged = await plane.stage(ctx, primary, stage)
    if staged.failed is not None:
        why = f"copying PostgreSQL {state.new_major} from image {stage.image} onto {primary.name}'s volume"
        await fail_check(plane, ctx, state, f"{why} failed: {staged.failed}")
        return
    if not staged.done:
        ctx.again_in(POLL_SECONDS)
        return
    res = await plane.exec(ctx, primary.name, mu.check_script(layout_of(state), state.new_major), 600)
    if res is None:
        ctx.again_in(POLL_SECONDS)
        return
    code, output = res
    if code != 0:
        await fail_check(plane, ctx, state, mu.check_failure_reason(output))
        return
    passed = ("Normal", "MajorUpgradeCheckPassed",
              f"pg_upgrade --check passed on {primary.name}; stopping writes to upgrade")  # fmt: skip
    await plane.save(ctx, state.moved(Outcome.PASSED, primary=primary.name), passed)
    ctx.again_in(0.1)


async def fail_check(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState, reason: str) -> None:
    if state.image is not None:
        reason = f"spec.image {state.image}: {reason}"  # the user's image: say it is the one checked
    failed = state.moved(Outcome.FAILED, message=reason, checked=time.time())
    await plane.save(ctx, failed, ("Warning", "MajorUpgradeCheckFailed",
                                   f"upgrade to PostgreSQL {state.new_major} refused, still serving "
                                   f"{state.old_major}: {reason}"))  # fmt: skip
    ctx.report(("MajorUpgradeCheckFailed", reason))


async def check_failed(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    wait = check_retry_in(state, time.time())
    if wait > 0:
        ctx.report(("MajorUpgradeCheckFailed", state.message or ""))
        ctx.again_in(wait)
        return
    await plane.save(ctx, state.moved(Outcome.RETRY))
    ctx.again_in(0.1)


async def rolled_back(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    # Serving the old major again; removing the annotation (or a new spec.image) tries again.
    ctx.report(("MajorUpgradeRolledBack", (state.message or "")[-400:]))


# --- Upgrading ---------------------------------------------------------------------------------------


async def upgrading(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    # The primary the check ran on (its role label may change once PostgreSQL is stopped, and a reconcile
    # that failed half-way comes back here: every step below may run again).
    primary = plane.named(ctx, state.primary)
    if primary is None or primary.container_down:
        ctx.again_in(POLL_SECONDS)
        return
    ready: UpgradeState | None = state
    if ctx.cluster.spec.backup is not None and state.paused is None and state.archived is None:
        ready = await archive_before_stop(plane, ctx, state, primary)
    if ready is not None:
        ready = await pause_writes(plane, ctx, ready, primary)
    if ready is not None:
        await stop_and_upgrade(plane, ctx, ready, primary)


async def archive_before_stop(
    plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState, primary: Instance
) -> UpgradeState | None:
    """The old major's archive must be current (and working) before writes stop: what it lacks then, no
    restore to a time before the upgrade could ever replay. None: refused (saved and reported)."""
    # Word-split by the script (`$PSQL -c …`), so without the pinning env (the script's sessions stay in
    # the `postgres` database, which no tenant owns).
    script = mu.archive_current_script(" ".join(PSQL_ARGV), ARCHIVE_WAIT_SECONDS)
    res = await plane.exec(ctx, primary.name, script, ARCHIVE_WAIT_SECONDS + 30)
    if res is not None and res[0] == 0:
        archived = state.with_(archived=time.time())
        plane.note(ctx, archived)
        return archived
    why = (res[1].strip() if res is not None else "") or "the primary could not be asked"
    refused = state.moved(Outcome.REFUSED, message=why[-600:], checked=time.time())
    await plane.save(ctx, refused, ("Warning", "MajorUpgradeArchiveBehind",
                                    f"upgrade to PostgreSQL {state.new_major} not started, still serving "
                                    f"{state.old_major}: the old major's WAL must be archived before writes "
                                    f"stop: {why[-400:]}"))  # fmt: skip
    ctx.report(("MajorUpgradeArchiveBehind", why[-400:]))
    return None


async def pause_writes(
    plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState, primary: Instance
) -> UpgradeState | None:
    """Patroni paused, and taken by every member; None: ask again on a later reconcile."""
    if not await plane.pause(ctx, primary, True):
        ctx.again_in(POLL_SECONDS)
        return None
    if state.paused is None:
        state = state.with_(paused=time.time())
        message = f"Patroni paused; stopping PostgreSQL {state.old_major} to upgrade it"
        await plane.save(ctx, state, ("Normal", "MajorUpgradeWritesStopping", message))
    # Members take the pause on their next loop (a config change wakes it at once); one that has not
    # would restart what stops. Waited for no longer than a whole loop.
    until = (state.paused or 0.0) + ctx.cluster.spec.patroni.loop_wait + 2
    if not await plane.paused_everywhere(ctx, plane.instances(ctx), until):
        ctx.again_in(PAUSE_POLL_SECONDS)
        return None
    return state


async def stop_and_upgrade(
    plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState, primary: Instance
) -> None:
    """The primary first: its shutdown checkpoint is the old major's last record. Each replica stops once it
    has replayed it (a replica at that checkpoint holds the same data and keeps it), while the primary
    upgrades. The outage counts from the stop's request (the shutdown checkpoint is part of it);
    `writes_stopped`, once the primary's stop returned, is the old generation's end."""
    replicas = [i for i in plane.instances(ctx) if i.name != primary.name]
    layout, old, new = layout_of(state), state.old_major, state.new_major
    state = state.with_(stop_requested=state.stop_requested or time.time())
    plane.note(ctx, state)  # a retried pass counts the outage from the first stop
    stopped = await plane.exec(ctx, primary.name, mur.stop_primary_script(layout, old), 180)
    checkpoint = mur.checkpoint_of(stopped[1]) if stopped is not None else None
    state = state.with_(writes_stopped=time.time(), checkpoint=checkpoint)
    plane.note(ctx, state)
    script = mu.upgrade_script(layout, old, new, require_archived=ctx.cluster.spec.backup is not None)
    replica_stop = mur.stop_replica_script(layout, old, new, checkpoint, " ".join(PSQL_ARGV),
                                           REPLICA_CATCH_UP_SECONDS)  # fmt: skip
    res, *replica_stops = await asyncio.gather(
        plane.exec(ctx, primary.name, script, 3600),
        *(plane.exec(ctx, inst.name, replica_stop, REPLICA_CATCH_UP_SECONDS + 150) for inst in replicas),
    )
    code, output = res if res is not None else (1, "the upgrade could not be run")
    sysid = upgraded_system_identifier(code, output)
    if sysid is None:
        await plane.pause(ctx, primary, False)  # Patroni starts the old major on its restored data
        message = f"upgrade to {new} failed and was rolled back; {old} serves again: {output[-400:]}"
        rolled_back = state.moved(Outcome.FAILED, message=output[-600:])
        await plane.save(ctx, rolled_back, ("Warning", "MajorUpgradeRolledBack", message))
        ctx.report(("MajorUpgradeRolledBack", output[-400:]))
        return
    await plane.set_initialize(ctx, sysid)
    outputs = {inst.name: (out[1] if out is not None else None)
               for inst, out in zip(replicas, replica_stops, strict=True)}  # fmt: skip
    await seed_and_start(plane, ctx, state, primary, mur.plan(checkpoint, outputs))


async def seed_and_start(
    plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState, primary: Instance, plan: mur.ReplicaPlan
) -> None:
    """Replicas at the primary's checkpoint seeded; one not seeded cannot follow the new system identifier:
    emptied (re-cloned), all at once. Then the new major starts (the StatefulSet at it)."""
    seeded = await plane.seed_replicas(ctx, primary, layout_of(state), state, plan)
    await asyncio.gather(
        *(plane.exec(ctx, name, f"find {PGDATA} -mindepth 1 -delete", 600) for name in seeded.recloned)
    )
    replicas = {**{name: "linked" for name in seeded.linked},
                **{name: f"re-cloned: {why}" for name, why in seeded.recloned.items()}}  # fmt: skip
    cost: dict[str, Any] = {}
    if seeded.seconds is not None:
        cost = {"seed_seconds": seeded.seconds, "seed_bytes": seeded.bytes}
    state = state.moved(Outcome.PASSED, primary=primary.name, replicas=replicas, **cost)
    annotations, gens = started_generations(ctx, state)
    message = (
        f"data upgraded to PostgreSQL {state.new_major} on {primary.name}; starting it; replicas: "
        f"{mur.summary(seeded.linked, seeded.recloned)}"
    )
    await plane.save(ctx, state, ("Normal", "MajorUpgradeStarting", message), annotations=annotations)
    await announce_generation(plane, ctx, gens)
    ctx.cluster = at_major(ctx.cluster, state.new_major, state.image)
    ctx.again_in(0.1)


# --- Starting, ReplicasCatchingUp, Analyzing -----------------------------------------------------------


async def starting(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    image = upgrade_image(state)
    instances = plane.instances(ctx)
    primary = next((i for i in instances if i.name == state.primary), None)
    if primary is None or primary.image != image or primary.container_down or not primary.pod_ip:
        ctx.again_in(OUTAGE_POLL_SECONDS)
        return
    if state.resumed is None:
        # Not while a pod of the old image still runs (the follow-up deletes the replicas' after the
        # primary's): an old major's Patroni must never act on the emptied or upgraded data.
        if old_image_runs(instances, image) or not await plane.pause(ctx, primary, False):
            ctx.again_in(OUTAGE_POLL_SECONDS)
            return
        state = state.with_(resumed=time.time())
        await plane.save(ctx, state)
    leader = new_primary(instances, image)
    if leader is None:
        ctx.again_in(OUTAGE_POLL_SECONDS)
        return
    state = state.with_(primary=leader.name)
    plane.note(ctx, state)
    if ctx.cluster.spec.backup is not None and not state.base_backup:
        state = state.with_(base_backup=await base_backup(plane, ctx, state))
    state = state.moved(Outcome.PASSED, writable=time.time())
    outage = mu.write_outage_seconds(outage_start(state), state.writable)
    message = (
        f"{leader.name} takes writes on PostgreSQL {state.new_major} (writes stopped for {outage} s); "
        "replicas are catching up"
    )
    await plane.save(ctx, state, ("Normal", "MajorUpgradePrimaryWritable", message))


async def replicas_catching_up(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    if not replicas_back(plane.instances(ctx), ctx.cluster.spec.replicas):
        ctx.again_in(POLL_SECONDS)
        return
    await plane.save(ctx, state.moved(Outcome.PASSED, replicas_back=time.time()),
                     ("Normal", "MajorUpgradeReplicasBack",
                      f"every replica follows the new primary on PostgreSQL {state.new_major}"))  # fmt: skip
    ctx.again_in(0.1)


async def analyzing(plane: UpgradePlane, ctx: ReconcileContext, state: UpgradeState) -> None:
    primary = plane.primary(ctx)
    if primary is None:
        ctx.again_in(POLL_SECONDS)
        return
    argv = mu.statistics_argv("/usr/lib/postgresql/current/bin", state.new_major)
    command = " ".join(argv) + " -h /var/run/postgresql -U postgres --quiet"
    command += f" && rm -rf {mu.WORK_DIR}"  # the staged tree and the old data directory
    res = await plane.exec(ctx, primary.name, command, 3600)
    if res is None or res[0] != 0:
        ctx.report(("MajorUpgradeAnalyzeFailed", (res or (1, "not run"))[1][-400:]))
        ctx.again_in(30)
        return
    # A seeded replica kept its old data directory in its own work directory (its data files are shared
    # with the new one; only the old catalogs are freed). A failure leaves files, not a wrong cluster.
    others = [i.name for i in plane.instances(ctx) if i.name != primary.name]
    await asyncio.gather(*(plane.exec(ctx, name, f"rm -rf {mu.WORK_DIR}", 600) for name in others))
    outage = mu.write_outage_seconds(outage_start(state), state.writable)
    done = state.moved(Outcome.PASSED, finished=time.time(), outage=outage)
    await plane.save(ctx, done, ("Normal", "MajorUpgradeCompleted",
                                 f"upgraded from PostgreSQL {state.old_major} to {state.new_major}; write "
                                 f"outage {outage} s"))  # fmt: skip


# The step of each phase; Done has none.
STEPS: dict[Phase, Step] = {
    Phase.CHECKING: checking,
    Phase.CHECK_FAILED: check_failed,
    Phase.ROLLED_BACK: rolled_back,
    Phase.UPGRADING: upgrading,
    Phase.STARTING: starting,
    Phase.REPLICAS_CATCHING_UP: replicas_catching_up,
    Phase.ANALYZING: analyzing,
}
