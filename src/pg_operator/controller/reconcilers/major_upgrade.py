"""The major-upgrade sub-reconciler: a raised `spec.version` upgrades the cluster in place
(docs/major-upgrades.md).

The data runs the major in the StatefulSet's `PGOP_PG_MAJOR`; until the upgrade has moved the data, every
other sub-reconciler builds the cluster at that major (the pass's cluster is replaced by one at the running
major), so no pod is ever started with a newer major's binaries on older data. The steps, one phase per pass,
state kept in the cluster's `db.example.com/major-upgrade` annotation (JSON):

  Checking     the new major's tree copied onto the primary's volume by an ephemeral container of the new
               image, then the live `pg_upgrade --check` in the primary's container; the cluster serves
  CheckFailed  pg_upgrade's reason in a Warning Event and the reported problem; checked again every
               CHECK_RETRY_SECONDS (the user may fix the cause meanwhile)
  Upgrading    Patroni paused (until every member says it took the pause), the primary stopped, then each
               replica once it replayed the primary's shutdown checkpoint while the upgrade script runs on
               the primary; a failure rolls back (the script restored the data) and Patroni resumes on the
               old major: RolledBack. Success: Patroni's `initialize` key gets the new system identifier;
               each replica at the primary's checkpoint gets the new cluster streamed from the primary and
               hard-linked to its own data files, the others are emptied (re-cloned)
  Starting     the StatefulSet at the new major; the primary's pod recreated first, the replicas' once
               its replacement exists (a head start for the primary's), then Patroni resumed
  ReplicasCatchingUp, Analyzing, Done

Orchestration: `orchestration/major_upgrade.py` (phases, scripts, reasons) and
`orchestration/major_upgrade_replicas.py` (which replicas keep their data, and the seed's scripts).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import PGDATA, ROLE_PRIMARY
from pg_operator.backup import generations
from pg_operator.backup.from_spec import archive_settings, recovery_source
from pg_operator.controller import backup_kinds as _backup_kinds
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, PostgresClusterResource
from pg_operator.controller.pod_exec import PSQL_ARGV, ExecError, PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.reconcilers.high_availability import HighAvailabilityReconciler, patroni_auth
from pg_operator.controller.store_client import (
    StoreError,
    put_object,
    read_object,
    s3_access,
    store_access,
)
from pg_operator.images import BUILT_VERSIONS, default_image
from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration import major_upgrade_replicas as mur
from pg_operator.orchestration.instances import Instance, instances_from_pods, patroni_state
from pg_operator.patroni.client import PatroniError, patch_config

log = logging.getLogger(__name__)

ANNOTATION = "db.example.com/major-upgrade"
CHECK_RETRY_SECONDS = 300.0
POLL_SECONDS = 3.0
# While writes are stopped every second counts: the passes waiting on the instances poll faster.
OUTAGE_POLL_SECONDS = 1.0
PAUSE_POLL_SECONDS = 0.5
OLD_BIN = "/usr/lib/postgresql/current/bin"
# Before writes stop, the old major's current WAL segment must be archived within this many seconds.
ARCHIVE_WAIT_SECONDS = 120
# How long a replica may take to replay the primary's shutdown checkpoint before it is stopped anyway (and
# re-cloned): the primary's upgrade runs meanwhile, so a caught-up replica costs no outage.
REPLICA_CATCH_UP_SECONDS = 10
# How long streaming the new cluster's unlinked files (catalogs, pg_xact, WAL) to the replicas may take.
SEED_SECONDS = 600


def running_major(statefulset: Mapping[str, Any] | None) -> str | None:
    """The major the data runs: the StatefulSet's PGOP_PG_MAJOR (None before the StatefulSet exists)."""
    containers = (objects.spec(statefulset).get("template") or {}).get("spec", {}).get("containers") or ()
    for c in containers:
        if c.get("name") == "postgres":
            for env in c.get("env") or ():
                if env.get("name") == "PGOP_PG_MAJOR":
                    return str(env.get("value"))
    return None


def at_major(cluster: PostgresCluster, major: str) -> PostgresCluster:
    """The cluster as the other sub-reconcilers must build it while the data is still on `major`."""
    if cluster.spec.version == major:
        return cluster
    spec = cluster.spec.model_copy(update={"version": major, "image": None})
    return cluster.model_copy(update={"spec": spec})


def with_archive_server(cluster: PostgresCluster, server: str) -> PostgresCluster:
    """The cluster as its children must be built while it archives to backup generation `server`."""
    backup = cluster.spec.backup
    if backup is None or (backup.generation_server_name or cluster.name) == server:
        return cluster
    spec = cluster.spec.model_copy(
        update={"backup": backup.model_copy(update={"generation_server_name": server})}
    )
    return cluster.model_copy(update={"spec": spec})


def with_recovery_server(cluster: PostgresCluster, server: str) -> PostgresCluster:
    """The cluster as its children must be built when it restores from generation `server` of its
    source's backups."""
    recovery = cluster.spec.bootstrap.recovery
    if recovery is None or (recovery.source.generation_server_name or recovery.source.cluster_name) == server:
        return cluster
    source = recovery.source.model_copy(update={"generation_server_name": server})
    bootstrap = cluster.spec.bootstrap.model_copy(
        update={"recovery": recovery.model_copy(update={"source": source})}
    )
    return cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"bootstrap": bootstrap})})


def replaced(instances: list[Instance], name: str, image: str) -> bool:
    """Whether the pod `name` has been recreated with `image` (a pod of the new major exists)."""
    return any(i.name == name and i.image == image and not i.terminating for i in instances)


def new_primary(instances: list[Instance], image: str) -> Instance | None:
    """The instance that leads on the new major once Patroni resumed. Not necessarily the upgraded
    primary: the leader key lapsed while the pods were recreated, and Patroni's race may go to a seeded
    replica, which holds the very same data (the primary's shutdown checkpoint, the same new cluster).
    An emptied replica cannot win it (it has nothing to start), nor can a pod of the old image."""
    leaders = (i for i in instances if i.image == image and i.role == ROLE_PRIMARY and i.ready)
    return next((i for i in leaders if not i.terminating), None)


def outage_start(state: Mapping[str, Any]) -> float | None:
    """When writes stopped: the stop's request (an upgrade begun by an older operator has only the
    moment every stop had returned)."""
    start = state.get("stopRequested", state.get("writesStopped"))
    return float(start) if start is not None else None


def read_state(body: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = objects.annotation(body, ANNOTATION)
    try:
        state = json.loads(raw) if raw else None
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def staging_container(name: str, version: str) -> dict[str, Any]:
    """The ephemeral container that copies the new major's tree onto the primary's volume. Its security
    context passes the `restricted` Pod Security level, as the instance's own container does: an
    ephemeral container is admitted against the namespace's level like any other."""
    target = mu.staged_binaries(version)
    return {
        "name": name,
        "image": default_image(version.split(".")[0]),
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "/bin/sh",
            "-c",
            f"rm -rf {target}.tmp && mkdir -p {mu.WORK_DIR} && "
            f"cp -a /usr/lib/postgresql/{version} {target}.tmp && rm -rf {target} && "
            f"mv {target}.tmp {target}",
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
        "securityContext": {
            "runAsUser": 999,
            "runAsGroup": 999,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


class MajorUpgradeReconciler(SubReconciler):
    def __init__(
        self,
        api: Api,
        events: EventRecorder,
        pod_exec: PodExec | None,
        high_availability: HighAvailabilityReconciler,
    ) -> None:
        self.api = api
        self.events = events
        self.pod_exec = pod_exec
        self.ha = high_availability
        # The state each cluster's upgrade was last saved with: a pass may come before the watch cache
        # shows the annotation written by the previous one, and must not redo a step.
        self._states: dict[tuple[str, str], dict[str, Any]] = {}
        # The generation of its source's backups each restored cluster reads (decided once).
        self._recovery: dict[tuple[str, str], generations.Generation] = {}

    def _state(self, ctx: ReconcileContext) -> dict[str, Any] | None:
        saved = read_state(ctx.body)
        mine = self._states.get((ctx.namespace, ctx.name))
        if mine is None:
            return saved
        if saved is None and mine.get("phase") in ("CheckFailed", "RolledBack", "Done"):
            # The user removed the annotation: try again (after fixing what the check or upgrade said).
            del self._states[(ctx.namespace, ctx.name)]
            return None
        return mine

    def forget(self, key: tuple[str, str]) -> None:
        self._states.pop(key, None)
        self._recovery.pop(key, None)

    # --- the pass ------------------------------------------------------------------------------------

    async def act(self, ctx: ReconcileContext) -> None:
        if ctx.cluster.spec.bootstrap.recovery is not None:
            await self._recovery_generation(ctx)
        await self._act(ctx)
        self._follow_generation(ctx)

    def _follow_generation(self, ctx: ReconcileContext) -> None:
        """Every child is built with the server name of the generation the held major archives to."""
        if ctx.cluster.spec.backup is None:
            return
        gens = generations.of_cluster(ctx.body)
        state = self._state(ctx)
        if not gens and state is not None and state.get("from"):
            gens = generations.first(ctx.name, str(state["from"]))
        server = generations.for_major(gens, ctx.name, ctx.cluster.spec.version)
        ctx.cluster = with_archive_server(ctx.cluster, server)

    async def _act(self, ctx: ReconcileContext) -> None:
        running = running_major(ctx.statefulset)
        state = self._state(ctx)
        wanted = ctx.cluster.spec.version
        if state is not None and state.get("phase") in ("Starting", *mu.PAST_NO_RETURN):
            await self._store_generations(ctx, state)
        if running is None or (running == wanted and (state is None or state.get("phase") == "Done")):
            return
        if state is None or state.get("to") != wanted:
            try:
                request = mu.requested(wanted, running)
            except ValueError as exc:
                ctx.report(("MajorDowngradeRefused", str(exc)))
                ctx.cluster = at_major(ctx.cluster, running)
                return
            if request is None:
                return
            state = {
                "from": request.old_major,
                "to": request.new_major,
                "phase": "Checking",
                "started": time.time(),
            }
            await self._save(
                ctx,
                state,
                "Normal",
                "MajorUpgradeChecking",
                f"checking the upgrade from PostgreSQL {running} to {wanted} on the live data",
            )
        phase = str(state["phase"])
        # The data is on the old major until the upgrade swapped it; hold every other sub-reconciler there.
        held = state["to"] if phase in ("Starting", *mu.PAST_NO_RETURN) else state["from"]
        ctx.cluster = at_major(ctx.cluster, held)
        if self.pod_exec is None:
            ctx.report(("MajorUpgradeUnavailable", "the operator runs without pod exec"))
            return
        step = getattr(self, "_" + phase.lower(), None)
        if step is not None:
            await step(ctx, state)

    # --- phases --------------------------------------------------------------------------------------

    async def _checking(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        primary = self._primary(ctx)
        if primary is None:
            ctx.again_in(POLL_SECONDS)
            return
        version = BUILT_VERSIONS[state["to"]][0]
        staged = await self._staged(ctx, primary, version)
        if staged is None:
            ctx.again_in(POLL_SECONDS)
            return
        if staged:
            await self._fail_check(
                ctx, state, f"copying PostgreSQL {version} onto {primary.name}'s volume failed"
            )
            return
        layout = mu.Layout(old_bin=OLD_BIN, new_home=mu.staged_binaries(version))
        res = await self._exec(ctx, primary.name, mu.check_script(layout), 600)
        if res is None:
            ctx.again_in(POLL_SECONDS)
            return
        code, output = res
        if code != 0:
            await self._fail_check(ctx, state, mu.check_failure_reason(output))
            return
        state.update(phase="Upgrading", primary=primary.name)
        await self._save(
            ctx,
            state,
            "Normal",
            "MajorUpgradeCheckPassed",
            f"pg_upgrade --check passed on {primary.name}; stopping writes to upgrade",
        )
        ctx.again_in(0.1)

    async def _fail_check(self, ctx: ReconcileContext, state: dict[str, Any], reason: str) -> None:
        state.update(phase="CheckFailed", message=reason, checked=time.time())
        await self._save(
            ctx,
            state,
            "Warning",
            "MajorUpgradeCheckFailed",
            f"upgrade to PostgreSQL {state['to']} refused, still serving {state['from']}: {reason}",
        )
        ctx.report(("MajorUpgradeCheckFailed", reason))

    async def _checkfailed(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        wait = float(state.get("checked") or 0) + CHECK_RETRY_SECONDS - time.time()
        if wait > 0:
            ctx.report(("MajorUpgradeCheckFailed", str(state.get("message") or "")))
            ctx.again_in(wait)
            return
        state["phase"] = "Checking"
        await self._save(ctx, state, None, "", "")
        ctx.again_in(0.1)

    async def _rolledback(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        # Serving the old major again; removing the annotation tries again.
        ctx.report(("MajorUpgradeRolledBack", str(state.get("message") or "")[-400:]))

    async def _upgrading(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        # The primary the check ran on (its role label may change once PostgreSQL is stopped, and a pass
        # that failed half-way comes back here: every step below may run again).
        instances = instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))
        primary = next((i for i in instances if i.name == state.get("primary")), None)
        if primary is None or primary.container_down:
            ctx.again_in(POLL_SECONDS)
            return
        if ctx.cluster.spec.backup is not None and not state.get("paused") and not state.get("archived"):
            # The old major's archive must be current (and working) before writes stop: what it lacks
            # then, no restore to a time before the upgrade could ever replay.
            # Word-split by the script (`$PSQL -c …`), so without the pinning env (the script's
            # sessions stay in the `postgres` database, which no tenant owns).
            psql = " ".join(PSQL_ARGV)
            res = await self._exec(ctx, primary.name, mu.archive_current_script(psql, ARCHIVE_WAIT_SECONDS),
                                   ARCHIVE_WAIT_SECONDS + 30)  # fmt: skip
            if res is None or res[0] != 0:
                why = (res[1].strip() if res is not None else "") or "the primary could not be asked"
                state.update(phase="CheckFailed", message=why[-600:], checked=time.time())
                await self._save(
                    ctx,
                    state,
                    "Warning",
                    "MajorUpgradeArchiveBehind",
                    f"upgrade to PostgreSQL {state['to']} not started, still serving {state['from']}: the "
                    f"old major's WAL must be archived before writes stop: {why[-400:]}",
                )
                ctx.report(("MajorUpgradeArchiveBehind", why[-400:]))
                return
            state["archived"] = time.time()
        if not await self._pause(ctx, primary, True):
            ctx.again_in(POLL_SECONDS)
            return
        if not state.get("paused"):
            # Members take the pause on their next loop; one that has not would restart what stops.
            state["paused"] = time.time()
            await self._save(
                ctx,
                state,
                "Normal",
                "MajorUpgradeWritesStopping",
                f"Patroni paused; stopping PostgreSQL {state['from']} to upgrade it",
            )
        # Members take the pause on their next loop (a config change wakes it at once); one that has not
        # would restart what stops. Waited for no longer than a whole loop, as before this was polled.
        if not await self._paused_everywhere(
            ctx, instances, float(state["paused"]) + ctx.cluster.spec.patroni.loop_wait + 2
        ):
            ctx.again_in(PAUSE_POLL_SECONDS)
            return
        replicas = [i for i in instances if i.name != primary.name]
        version = BUILT_VERSIONS[state["to"]][0]
        layout = mu.Layout(old_bin=OLD_BIN, new_home=mu.staged_binaries(version))
        # The primary first: its shutdown checkpoint is the old major's last record. Each replica stops once
        # it has replayed it (a replica at that checkpoint holds the same data and keeps it), while the
        # primary upgrades. The outage is counted from the stop's request (the shutdown checkpoint is part
        # of it); `writesStopped`, once the primary's stop returned, is the old generation's end.
        state.setdefault("stopRequested", time.time())
        stopped = await self._exec(ctx, primary.name, mur.stop_primary_script(layout, state["from"]), 180)
        state["writesStopped"] = time.time()
        checkpoint = mur.checkpoint_of(stopped[1]) if stopped is not None else None
        state["checkpoint"] = checkpoint
        script = mu.upgrade_script(layout, state["from"], state["to"],
                                   require_archived=ctx.cluster.spec.backup is not None)  # fmt: skip
        replica_stop = mur.stop_replica_script(layout, state["from"], state["to"], checkpoint,
                                               " ".join(PSQL_ARGV), REPLICA_CATCH_UP_SECONDS)  # fmt: skip
        res, *replica_stops = await asyncio.gather(
            self._exec(ctx, primary.name, script, 3600),
            *(self._exec(ctx, inst.name, replica_stop, REPLICA_CATCH_UP_SECONDS + 150) for inst in replicas),
        )
        code, output = res if res is not None else (1, "the upgrade could not be run")
        sysid = next(
            (ln.split(": ", 1)[1] for ln in output.splitlines() if ln.startswith("system identifier: ")), None
        )
        if code != 0 or sysid is None:
            await self._pause(ctx, primary, False)  # Patroni starts the old major on its restored data
            state.update(phase="RolledBack", message=output[-600:])
            await self._save(
                ctx,
                state,
                "Warning",
                "MajorUpgradeRolledBack",
                f"upgrade to {state['to']} failed and was rolled back; {state['from']} serves "
                f"again: {output[-400:]}",
            )
            ctx.report(("MajorUpgradeRolledBack", output[-400:]))
            return
        await self._set_initialize(ctx, sysid)
        outputs = {inst.name: (out[1] if out is not None else None)
                   for inst, out in zip(replicas, replica_stops, strict=True)}  # fmt: skip
        plan = mur.plan(checkpoint, outputs)
        linked, recloned = await self._seed_replicas(ctx, primary, layout, state, checkpoint, plan)
        # A replica not seeded cannot follow the new system identifier: emptied (re-cloned), all at once.
        await asyncio.gather(
            *(self._exec(ctx, name, f"find {PGDATA} -mindepth 1 -delete", 600) for name in recloned)
        )
        state["replicas"] = {**{name: "linked" for name in linked},
                             **{name: f"re-cloned: {why}" for name, why in recloned.items()}}  # fmt: skip
        state.update(phase="Starting", primary=primary.name)
        annotations: dict[str, str] = {}
        gens: list[generations.Generation] = []
        if ctx.cluster.spec.backup is not None:
            # The new major archives to a generation of its own from its first start on.
            since = dt.datetime.fromtimestamp(float(state["writesStopped"]), dt.UTC)
            gens = generations.started(generations.of_cluster(ctx.body), ctx.name, str(state["from"]),
                                       str(state["to"]), since)  # fmt: skip
            annotations[generations.ANNOTATION] = generations.dump(gens)
        await self._save(
            ctx,
            state,
            "Normal",
            "MajorUpgradeStarting",
            f"data upgraded to PostgreSQL {state['to']} on {primary.name}; starting it; replicas: "
            f"{mur.summary(linked, recloned)}",
            annotations=annotations,
        )
        if gens and ctx.cluster.spec.backup is not None:
            old, new = gens[-2], gens[-1]
            prefix = archive_settings(ctx.cluster.spec.backup, new.server_name).store.prefix
            ctx.writes += int(await self.events.record(
                ctx.body, "Normal", "BackupGenerationStarted",
                f"PostgreSQL {new.major} archives to server {new.server_name} (s3 prefix {prefix}) from "
                f"its first start; a restore to a time before {new.since} reads PostgreSQL {old.major}'s "
                f"backups (server {old.server_name}); Backup {generations.base_backup_name(new)} "
                "follows once it takes writes",
            ))  # fmt: skip
        ctx.cluster = at_major(ctx.cluster, state["to"])
        ctx.again_in(0.1)

    async def follow_up(self, ctx: ReconcileContext) -> int:
        state = self._state(ctx)
        if state is None or state.get("phase") != "Starting":
            return 0
        image = default_image(state["to"])
        instances = instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))
        # The primary's pod first; the replicas' once its replacement exists: the primary's container is
        # created and started ahead of theirs. (Waiting longer, until its Patroni runs, only delays the
        # resume, which must wait for every pod of the old image to go.)
        primary = str(state.get("primary"))
        primary_replaced = replaced(instances, primary, image)
        writes = 0
        for inst in instances:
            turn = primary_replaced or inst.name == primary
            if inst.image != image and not inst.terminating and turn:
                await self.api.delete("v1", "Pod", inst.name, ctx.namespace)
                writes += 1
        return writes

    async def _starting(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        instances = instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))
        image = default_image(state["to"])
        primary = next((i for i in instances if i.name == state.get("primary")), None)
        if primary is None or primary.image != image or primary.container_down or not primary.pod_ip:
            ctx.again_in(OUTAGE_POLL_SECONDS)
            return
        if not state.get("resumed"):
            # Not while a pod of the old image still runs (settle deletes the replicas' after the
            # primary's): an old major's Patroni must never act on the emptied or upgraded data.
            if any(i.image != image and not i.terminating for i in instances):
                ctx.again_in(OUTAGE_POLL_SECONDS)
                return
            if not await self._pause(ctx, primary, False):
                ctx.again_in(OUTAGE_POLL_SECONDS)
                return
            state["resumed"] = time.time()
            await self._save(ctx, state, None, "", "")
        leader = new_primary(instances, image)
        if leader is None:
            ctx.again_in(OUTAGE_POLL_SECONDS)
            return
        state["primary"] = leader.name
        if ctx.cluster.spec.backup is not None and not state.get("baseBackup"):
            state["baseBackup"] = await self._base_backup(ctx)
        state.update(phase="ReplicasCatchingUp", writable=time.time())
        outage = mu.write_outage_seconds(outage_start(state), state["writable"])
        await self._save(
            ctx,
            state,
            "Normal",
            "MajorUpgradePrimaryWritable",
            f"{leader.name} takes writes on PostgreSQL {state['to']} (writes stopped for "
            f"{outage} s); replicas are catching up",
        )

    async def _replicascatchingup(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        instances = instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))
        if len(instances) < ctx.cluster.spec.replicas or not all(i.ready for i in instances):
            ctx.again_in(POLL_SECONDS)
            return
        state.update(phase="Analyzing", replicasBack=time.time())
        await self._save(
            ctx,
            state,
            "Normal",
            "MajorUpgradeReplicasBack",
            f"every replica follows the new primary on PostgreSQL {state['to']}",
        )
        ctx.again_in(0.1)

    async def _analyzing(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        primary = self._primary(ctx)
        if primary is None:
            ctx.again_in(POLL_SECONDS)
            return
        argv = mu.statistics_argv("/usr/lib/postgresql/current/bin", state["to"])
        command = " ".join(argv) + " -h /var/run/postgresql -U postgres --quiet"
        command += f" && rm -rf {mu.WORK_DIR}"  # the staged tree and the old data directory
        res = await self._exec(ctx, primary.name, command, 3600)
        if res is None or res[0] != 0:
            ctx.report(("MajorUpgradeAnalyzeFailed", (res or (1, "not run"))[1][-400:]))
            ctx.again_in(30)
            return
        # A seeded replica kept its old data directory in its own work directory (its data files are shared
        # with the new one; only the old catalogs are freed). A failure leaves files, not a wrong cluster.
        pods = instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))
        others = [i.name for i in pods if i.name != primary.name]
        await asyncio.gather(*(self._exec(ctx, name, f"rm -rf {mu.WORK_DIR}", 600) for name in others))
        outage = mu.write_outage_seconds(outage_start(state), state.get("writable"))
        state.update(phase="Done", finished=time.time(), outage=outage)
        await self._save(
            ctx,
            state,
            "Normal",
            "MajorUpgradeCompleted",
            f"upgraded from PostgreSQL {state['from']} to {state['to']}; write outage {outage} s",
        )

    # --- helpers -------------------------------------------------------------------------------------

    def _primary(self, ctx: ReconcileContext) -> Instance | None:
        for inst in instances_from_pods(ctx.snapshot.of_kind("v1", "Pod")):
            if inst.role == ROLE_PRIMARY and inst.ready and not inst.terminating:
                return inst
        return None

    async def _staged(self, ctx: ReconcileContext, primary: Instance, version: str) -> bool | None:
        """Copy the new major's tree onto the primary's volume with an ephemeral container of the new
        image: None while it runs, False once copied, True when it failed."""
        name = f"stage-{version.replace('.', '-')}"
        pod = ctx.snapshot.find("v1", "Pod", primary.name) or {}
        for st in (pod.get("status") or {}).get("ephemeralContainerStatuses") or ():
            if st.get("name") == name:
                done = (st.get("state") or {}).get("terminated")
                return None if done is None else int(done.get("exitCode", 1)) != 0
        if any(c.get("name") == name for c in objects.spec(pod).get("ephemeralContainers") or ()):
            return None
        containers = [*(objects.spec(pod).get("ephemeralContainers") or ()), staging_container(name, version)]
        await self.api.client.patch(
            Pod.Ephemeralcontainers,
            primary.name,
            {"spec": {"ephemeralContainers": containers}},
            namespace=ctx.namespace,
            patch_type=PatchType.STRATEGIC,
        )
        return None

    async def _seed_replicas(
        self,
        ctx: ReconcileContext,
        primary: Instance,
        layout: mu.Layout,
        state: dict[str, Any],
        checkpoint: str | None,
        plan: mur.ReplicaPlan,
    ) -> tuple[list[str], dict[str, str]]:
        """Give each replica the plan allows the new cluster: the primary's unlinked files streamed into it,
        its own old files hard-linked. Returns the replicas seeded and, with why, those to re-clone."""
        recloned = dict(plan.reclone)
        if not plan.seed:
            return [], recloned
        assert self.pod_exec is not None
        source = (primary.name, ["/bin/sh", "-c", mur.source_script(layout, state["from"], state["to"])])
        sink = ["/bin/sh", "-c", mur.sink_script(layout, state["from"], state["to"], checkpoint or "")]
        started = time.monotonic()
        try:
            piped = await self.pod_exec.pipe(ctx.namespace, source, [(name, sink) for name in plan.seed],
                                             seconds=SEED_SECONDS)  # fmt: skip
        except ExecError as exc:
            log.info("%s/%s: streaming the new cluster from %s failed: %s",
                     ctx.namespace, ctx.name, primary.name, exc)  # fmt: skip
            unstreamed = dict.fromkeys(plan.seed, "the primary's new cluster could not be streamed")
            return [], {**recloned, **unstreamed}
        linked: list[str] = []
        for name in plan.seed:
            result = piped.sinks.get(name)
            failure = mur.seed_failure(piped.source.exit_status, piped.source.stderr, result)
            if failure is None:
                linked.append(name)
            else:
                recloned[name] = failure
        log.info(
            "%s/%s: seeded %s from %s (%d bytes in %.1f s); re-cloning %s",
            ctx.namespace,
            ctx.name,
            linked,
            primary.name,
            piped.bytes,
            time.monotonic() - started,
            sorted(recloned),
        )
        state["seedSeconds"] = round(time.monotonic() - started, 3)
        state["seedBytes"] = piped.bytes
        return linked, recloned

    async def _paused_everywhere(
        self, ctx: ReconcileContext, instances: list[Instance], until: float
    ) -> bool:
        """Poll the members' data (fresh from the API, not the pass's snapshot) until every member took
        the pause; True then, or once `until` has passed (a member whose Patroni does not run publishes
        nothing, but cannot start PostgreSQL either). False: ask again on the next pass."""
        while True:
            members: list[Mapping[str, Any]] = []
            for inst in instances:
                try:
                    pod = await self.api.get(Pod, inst.name, ctx.namespace)
                except ApiError as exc:
                    log.info("%s/%s: reading %s failed: %s", ctx.namespace, ctx.name, inst.name, exc)
                    return False
                members.append(patroni_state({"annotations": pod.metadata.annotations or {}}))
            if mu.members_paused(members) or time.time() >= until:
                return True
            await asyncio.sleep(PAUSE_POLL_SECONDS)

    async def _exec(
        self, ctx: ReconcileContext, pod: str, script: str, seconds: float
    ) -> tuple[int, str] | None:
        assert self.pod_exec is not None
        try:
            res = await self.pod_exec.run(ctx.namespace, pod, ["/bin/sh", "-c", script], seconds=seconds)
        except (ExecError, TimeoutError) as exc:
            log.info("%s/%s: exec in %s failed: %s", ctx.namespace, ctx.name, pod, exc)
            return None
        return res.exit_status, res.output

    async def _pause(self, ctx: ReconcileContext, primary: Instance, pause: bool) -> bool:
        member = self.ha.endpoint(ctx, primary)
        if member is None:
            return False
        try:
            await patch_config(
                self.ha.session(), member, {"pause": pause}, patroni_auth(ctx.snapshot, ctx.cluster)
            )
        except PatroniError as exc:
            log.info("%s/%s: pause=%s refused: %s", ctx.namespace, ctx.name, pause, exc)
            return False
        return True

    async def _set_initialize(self, ctx: ReconcileContext, sysid: str) -> None:
        """Patroni's record of the cluster's system identifier (and the old timelines' history) in its
        `<cluster>-config` ConfigMap: the new cluster has a new identifier and starts on timeline 1."""
        patch = {"metadata": {"annotations": {"initialize": sysid, "history": None}}}
        await self.api.merge_patch(ConfigMap, f"{ctx.name}-config", ctx.namespace, patch)

    async def _save(
        self,
        ctx: ReconcileContext,
        state: dict[str, Any],
        event_type: str | None,
        reason: str,
        message: str,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        patch = {"metadata": {"annotations": {**(annotations or {}),
                                              ANNOTATION: json.dumps(state, sort_keys=True)}}}  # fmt: skip
        try:
            await self.api.merge_patch(PostgresClusterResource, ctx.name, ctx.namespace, patch)
        except ApiError as exc:
            log.warning("%s/%s: could not record the upgrade's state: %s", ctx.namespace, ctx.name, exc)
            raise
        ctx.writes += 1
        self._states[(ctx.namespace, ctx.name)] = dict(state)
        if event_type:
            ctx.writes += int(await self.events.record(ctx.body, event_type, reason, message))

    # --- backups across the upgrade (backup.generations) -------------------------------------------------

    async def _base_backup(self, ctx: ReconcileContext) -> str:
        """The new generation's first base backup: a Backup object of the cluster, so it runs like any
        other (on a streaming replica when there is one, restart-safe, reported in its status and in
        LastBackupSucceeded, kept by retention)."""
        gens = generations.of_cluster(ctx.body)
        state = self._state(ctx) or {}
        current = generations.Generation(
            generations.for_major(gens or generations.first(ctx.name, str(state.get("from") or "")), ctx.name,
                                  str(state.get("to"))),
            str(state.get("to")),
        )  # fmt: skip
        body = generations.base_backup_object(ctx.namespace, ctx.name, ctx.cluster.uid, current)
        assert _backup_kinds.BackupResource  # the Backup kind is registered for create_dict
        try:
            await self.api.create_dict(body)
        except ApiError as exc:
            if exc.status.code != 409:
                log.warning("%s/%s: could not create the new generation's Backup: %s",
                            ctx.namespace, ctx.name, exc)  # fmt: skip
                raise
        ctx.writes += 1
        return str(body["metadata"]["name"])

    async def _store_generations(self, ctx: ReconcileContext, state: dict[str, Any]) -> None:
        """The generations file in the first generation's prefix, for restores that find the cluster gone
        (written once per upgrade; a failing store is reported and asked again on the next pass)."""
        config = ctx.cluster.spec.backup
        if config is None or state.get("generationsStored") == state.get("to"):
            return
        gens = generations.of_cluster(ctx.body)
        if len(gens) < 2 or gens[-1].major != state.get("to"):
            return  # the cache does not show the switch yet
        store = archive_settings(config, gens[0].server_name).store
        try:
            access = await store_access(self.api, ctx.namespace, config, store, cluster=ctx.name)
            document = generations.store_document(ctx.name, gens)
            await put_object(access, generations.store_key(store.prefix), document)
        except StoreError as exc:
            why = f"the generations file under {store.prefix} could not be written: {exc}"
            ctx.report(("BackupGenerationsUnrecorded", why))
            ctx.again_in(30)
            return
        state["generationsStored"] = state.get("to")
        await self._save(ctx, state, None, "", "")

    async def _recovery_generation(self, ctx: ReconcileContext) -> None:
        """A restored cluster reads the generation of its source's backups that holds the target, from the
        source's generations file (before its first instance starts; a source never upgraded with
        backups has none: its own name). The data runs the major it was backed up with, so a spec.version
        that differs is refused (the StatefulSet waits while a problem is reported)."""
        recovery = ctx.cluster.spec.bootstrap.recovery
        assert recovery is not None
        key = (ctx.namespace, ctx.name)
        chosen = generations.recovery_generation(ctx.body) or self._recovery.get(key)
        if chosen is None:
            if ctx.statefulset is not None:
                return  # restored before generations existed: the source's own name
            source = recovery_source(recovery)
            try:
                access = await s3_access(
                    self.api, ctx.namespace, recovery.source.s3, source, cluster=ctx.name, recovery=True
                )
                raw = await read_object(access, generations.store_key(source.prefix))
                gens = generations.parse(raw, f"{source.prefix}{generations.STORE_FILE}")
            except (StoreError, ValueError) as exc:
                ctx.report(
                    (
                        "RecoverySourceUnreadable",
                        f"the generations of {recovery.source.cluster_name}'s "
                        f"backups could not be read: {exc}",
                    )
                )
                ctx.again_in(15)
                return
            gens = gens or generations.first(recovery.source.cluster_name, ctx.cluster.spec.version)
            chosen = generations.for_target(
                gens, generations.target_time_of(recovery.target_time, recovery.backup_id)
            )
            self._recovery[key] = chosen
            record = json.dumps(chosen.to_mapping(), sort_keys=True)
            patch = {"metadata": {"annotations": {generations.RECOVERY_ANNOTATION: record}}}
            await self.api.merge_patch(PostgresClusterResource, ctx.name, ctx.namespace, patch)
            ctx.writes += 1
            if len(gens) > 1:
                ctx.writes += int(await self.events.record(
                    ctx.body, "Normal", "RecoveryGenerationChosen",
                    f"restoring from server {chosen.server_name} of {recovery.source.cluster_name}'s backups "
                    f"(PostgreSQL {chosen.major}), the generation that holds the target",
                ))  # fmt: skip
        if ctx.statefulset is None:
            refused = generations.major_mismatch(
                chosen, ctx.cluster.spec.version, recovery.source.cluster_name
            )
            if refused is not None:
                ctx.report(("RecoveryMajorMismatch", refused))
                return
        ctx.cluster = with_recovery_server(ctx.cluster, chosen.server_name)
