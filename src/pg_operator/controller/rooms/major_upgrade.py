"""The major-upgrade room: a raised `spec.version` upgrades the cluster in place (docs/major-upgrades.md).

The data runs the major in the StatefulSet's `PGOP_PG_MAJOR`; until the upgrade has moved the data, every
other room builds the cluster at that major (the pass's cluster is replaced by one at the running major),
so no pod is ever started with a newer major's binaries on older data. The steps, one phase per pass,
state kept in the cluster's `db.example.com/major-upgrade` annotation (JSON):

  Checking     the new major's tree copied onto the primary's volume by an ephemeral container of the new
               image, then the live `pg_upgrade --check` in the primary's container; the cluster serves
  CheckFailed  pg_upgrade's reason in a Warning Event and the reported problem; checked again every
               CHECK_RETRY_SECONDS (the user may fix the cause meanwhile)
  Upgrading    Patroni paused, PostgreSQL stopped (replicas, then the primary), the upgrade script on the
               primary; a failure rolls back (the script restored the data) and Patroni resumes on the
               old major: RolledBack. Success: Patroni's `initialize` key gets the new system identifier,
               the replicas' data directories are emptied (they are re-cloned)
  Starting     the StatefulSet at the new major, its pods recreated, Patroni resumed
  ReplicasCatchingUp, Analyzing, Done

Orchestration: `orchestration/major_upgrade.py` (phases, scripts, reasons).
"""

from __future__ import annotations

import asyncio
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
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, PostgresClusterResource
from pg_operator.controller.pod_exec import ExecError, PodExec
from pg_operator.controller.rooms import ClusterPass, Room
from pg_operator.controller.rooms.high_availability import HighAvailabilityRoom, patroni_auth
from pg_operator.images import BUILT_VERSIONS, default_image
from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration.instances import Instance, instances_from_pods
from pg_operator.patroni.client import PatroniError, patch_config

log = logging.getLogger(__name__)

ANNOTATION = "db.example.com/major-upgrade"
CHECK_RETRY_SECONDS = 300.0
POLL_SECONDS = 3.0
OLD_BIN = "/usr/lib/postgresql/current/bin"


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
    """The cluster as the other rooms must build it while the data is still on `major`."""
    if cluster.spec.version == major:
        return cluster
    spec = cluster.spec.model_copy(update={"version": major, "image": None})
    return cluster.model_copy(update={"spec": spec})


def read_state(body: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = objects.annotation(body, ANNOTATION)
    try:
        state = json.loads(raw) if raw else None
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


class MajorUpgradeRoom(Room):
    def __init__(
        self,
        api: Api,
        events: EventRecorder,
        pod_exec: PodExec | None,
        high_availability: HighAvailabilityRoom,
    ) -> None:
        self.api = api
        self.events = events
        self.pod_exec = pod_exec
        self.ha = high_availability
        # The state each cluster's upgrade was last saved with: a pass may come before the watch cache
        # shows the annotation written by the previous one, and must not redo a step.
        self._states: dict[tuple[str, str], dict[str, Any]] = {}

    def _state(self, p: ClusterPass) -> dict[str, Any] | None:
        saved = read_state(p.body)
        mine = self._states.get((p.namespace, p.name))
        if mine is None:
            return saved
        if saved is None and mine.get("phase") in ("CheckFailed", "RolledBack", "Done"):
            # The user removed the annotation: try again (after fixing what the check or upgrade said).
            del self._states[(p.namespace, p.name)]
            return None
        return mine

    def forget(self, key: tuple[str, str]) -> None:
        self._states.pop(key, None)

    # --- the pass ------------------------------------------------------------------------------------

    async def act(self, p: ClusterPass) -> None:
        running = running_major(p.statefulset)
        state = self._state(p)
        wanted = p.cluster.spec.version
        if running is None or (running == wanted and (state is None or state.get("phase") == "Done")):
            return
        if state is None or state.get("to") != wanted:
            try:
                request = mu.requested(wanted, running)
            except ValueError as exc:
                p.report(("MajorDowngradeRefused", str(exc)))
                p.cluster = at_major(p.cluster, running)
                return
            if request is None:
                return
            if p.cluster.spec.backup is not None:
                # The new major starts on timeline 1 again: its WAL would take the old major's names in
                # the same store prefix. Until the backup room keeps each major in its own place, refuse.
                p.report(
                    (
                        "MajorUpgradeRefused",
                        "an in-place major upgrade of a cluster with spec.backup is "
                        "not supported yet: its WAL would overwrite the old major's in the store",
                    )
                )
                p.cluster = at_major(p.cluster, running)
                return
            state = {
                "from": request.old_major,
                "to": request.new_major,
                "phase": "Checking",
                "started": time.time(),
            }
            await self._save(
                p,
                state,
                "Normal",
                "MajorUpgradeChecking",
                f"checking the upgrade from PostgreSQL {running} to {wanted} on the live data",
            )
        phase = str(state["phase"])
        # The data is on the old major until the upgrade swapped it; hold every other room there.
        held = state["to"] if phase in ("Starting", *mu.PAST_NO_RETURN) else state["from"]
        p.cluster = at_major(p.cluster, held)
        if self.pod_exec is None:
            p.report(("MajorUpgradeUnavailable", "the operator runs without pod exec"))
            return
        step = getattr(self, "_" + phase.lower(), None)
        if step is not None:
            await step(p, state)

    # --- phases --------------------------------------------------------------------------------------

    async def _checking(self, p: ClusterPass, state: dict[str, Any]) -> None:
        primary = self._primary(p)
        if primary is None:
            p.again_in(POLL_SECONDS)
            return
        version = BUILT_VERSIONS[state["to"]][0]
        staged = await self._staged(p, primary, version)
        if staged is None:
            p.again_in(POLL_SECONDS)
            return
        if staged:
            await self._fail_check(
                p, state, f"copying PostgreSQL {version} onto {primary.name}'s volume failed"
            )
            return
        layout = mu.Layout(old_bin=OLD_BIN, new_home=mu.staged_binaries(version))
        res = await self._exec(p, primary.name, mu.check_script(layout), 600)
        if res is None:
            p.again_in(POLL_SECONDS)
            return
        code, output = res
        if code != 0:
            await self._fail_check(p, state, mu.check_failure_reason(output))
            return
        state.update(phase="Upgrading", primary=primary.name)
        await self._save(
            p,
            state,
            "Normal",
            "MajorUpgradeCheckPassed",
            f"pg_upgrade --check passed on {primary.name}; stopping writes to upgrade",
        )
        p.again_in(0.1)

    async def _fail_check(self, p: ClusterPass, state: dict[str, Any], reason: str) -> None:
        state.update(phase="CheckFailed", message=reason, checked=time.time())
        await self._save(
            p,
            state,
            "Warning",
            "MajorUpgradeCheckFailed",
            f"upgrade to PostgreSQL {state['to']} refused, still serving {state['from']}: {reason}",
        )
        p.report(("MajorUpgradeCheckFailed", reason))

    async def _checkfailed(self, p: ClusterPass, state: dict[str, Any]) -> None:
        wait = float(state.get("checked") or 0) + CHECK_RETRY_SECONDS - time.time()
        if wait > 0:
            p.report(("MajorUpgradeCheckFailed", str(state.get("message") or "")))
            p.again_in(wait)
            return
        state["phase"] = "Checking"
        await self._save(p, state, None, "", "")
        p.again_in(0.1)

    async def _rolledback(self, p: ClusterPass, state: dict[str, Any]) -> None:
        # Serving the old major again; removing the annotation tries again.
        p.report(("MajorUpgradeRolledBack", str(state.get("message") or "")[-400:]))

    async def _upgrading(self, p: ClusterPass, state: dict[str, Any]) -> None:
        # The primary the check ran on (its role label may change once PostgreSQL is stopped, and a pass
        # that failed half-way comes back here: every step below may run again).
        instances = instances_from_pods(p.snapshot.of_kind("v1", "Pod"))
        primary = next((i for i in instances if i.name == state.get("primary")), None)
        if primary is None or primary.container_down:
            p.again_in(POLL_SECONDS)
            return
        if not await self._pause(p, primary, True):
            p.again_in(POLL_SECONDS)
            return
        if not state.get("paused"):
            # Members take the pause on their next loop; one that has not would restart what stops.
            state["paused"] = time.time()
            await self._save(
                p,
                state,
                "Normal",
                "MajorUpgradeWritesStopping",
                f"Patroni paused; stopping PostgreSQL {state['from']} to upgrade it",
            )
            await asyncio.sleep(p.cluster.spec.patroni.loop_wait + 2)
        replicas = [i for i in instances if i.name != primary.name]
        stop = f"pg_ctl stop -D {PGDATA} -m fast -w -t 120 || true"
        for inst in [*replicas, primary]:
            await self._exec(p, inst.name, stop, 180)
        state["writesStopped"] = time.time()
        version = BUILT_VERSIONS[state["to"]][0]
        layout = mu.Layout(old_bin=OLD_BIN, new_home=mu.staged_binaries(version))
        res = await self._exec(p, primary.name, mu.upgrade_script(layout, state["from"], state["to"]), 3600)
        code, output = res if res is not None else (1, "the upgrade could not be run")
        sysid = next(
            (ln.split(": ", 1)[1] for ln in output.splitlines() if ln.startswith("system identifier: ")), None
        )
        if code != 0 or sysid is None:
            await self._pause(p, primary, False)  # Patroni starts the old major on its restored data
            state.update(phase="RolledBack", message=output[-600:])
            await self._save(
                p,
                state,
                "Warning",
                "MajorUpgradeRolledBack",
                f"upgrade to {state['to']} failed and was rolled back; {state['from']} serves "
                f"again: {output[-400:]}",
            )
            p.report(("MajorUpgradeRolledBack", output[-400:]))
            return
        await self._set_initialize(p, sysid)
        for inst in replicas:  # a replica of the old system identifier cannot follow the new primary
            await self._exec(p, inst.name, f"find {PGDATA} -mindepth 1 -delete", 600)
        state.update(phase="Starting", primary=primary.name)
        await self._save(
            p,
            state,
            "Normal",
            "MajorUpgradeStarting",
            f"data upgraded to PostgreSQL {state['to']} on {primary.name}; starting it",
        )
        p.cluster = at_major(p.cluster, state["to"])
        p.again_in(0.1)

    async def settle(self, p: ClusterPass) -> int:
        state = self._state(p)
        if state is None or state.get("phase") != "Starting":
            return 0
        image = default_image(state["to"])
        writes = 0
        for inst in instances_from_pods(p.snapshot.of_kind("v1", "Pod")):
            if inst.image != image and not inst.terminating:
                await self.api.delete("v1", "Pod", inst.name, p.namespace)
                writes += 1
        return writes

    async def _starting(self, p: ClusterPass, state: dict[str, Any]) -> None:
        instances = instances_from_pods(p.snapshot.of_kind("v1", "Pod"))
        image = default_image(state["to"])
        primary = next((i for i in instances if i.name == state.get("primary")), None)
        if primary is None or primary.image != image or primary.container_down or not primary.pod_ip:
            p.again_in(POLL_SECONDS)
            return
        if not state.get("resumed"):
            if not await self._pause(p, primary, False):
                p.again_in(POLL_SECONDS)
                return
            state["resumed"] = time.time()
            await self._save(p, state, None, "", "")
        if not (primary.role == ROLE_PRIMARY and primary.ready):
            p.again_in(POLL_SECONDS)
            return
        state.update(phase="ReplicasCatchingUp", writable=time.time())
        outage = mu.write_outage_seconds(state.get("writesStopped"), state["writable"])
        await self._save(
            p,
            state,
            "Normal",
            "MajorUpgradePrimaryWritable",
            f"{primary.name} takes writes on PostgreSQL {state['to']} (writes stopped for "
            f"{outage} s); replicas are being re-cloned",
        )

    async def _replicascatchingup(self, p: ClusterPass, state: dict[str, Any]) -> None:
        instances = instances_from_pods(p.snapshot.of_kind("v1", "Pod"))
        if len(instances) < p.cluster.spec.replicas or not all(i.ready for i in instances):
            p.again_in(POLL_SECONDS)
            return
        state.update(phase="Analyzing", replicasBack=time.time())
        await self._save(
            p,
            state,
            "Normal",
            "MajorUpgradeReplicasBack",
            f"every replica follows the new primary on PostgreSQL {state['to']}",
        )
        p.again_in(0.1)

    async def _analyzing(self, p: ClusterPass, state: dict[str, Any]) -> None:
        primary = self._primary(p)
        if primary is None:
            p.again_in(POLL_SECONDS)
            return
        argv = mu.statistics_argv("/usr/lib/postgresql/current/bin", state["to"])
        command = " ".join(argv) + " -h /var/run/postgresql -U postgres --quiet"
        command += f" && rm -rf {mu.WORK_DIR}"  # the staged tree and the old data directory
        res = await self._exec(p, primary.name, command, 3600)
        if res is None or res[0] != 0:
            p.report(("MajorUpgradeAnalyzeFailed", (res or (1, "not run"))[1][-400:]))
            p.again_in(30)
            return
        outage = mu.write_outage_seconds(state.get("writesStopped"), state.get("writable"))
        state.update(phase="Done", finished=time.time(), outage=outage)
        await self._save(
            p,
            state,
            "Normal",
            "MajorUpgradeCompleted",
            f"upgraded from PostgreSQL {state['from']} to {state['to']}; write outage {outage} s",
        )

    # --- helpers -------------------------------------------------------------------------------------

    def _primary(self, p: ClusterPass) -> Instance | None:
        for inst in instances_from_pods(p.snapshot.of_kind("v1", "Pod")):
            if inst.role == ROLE_PRIMARY and inst.ready and not inst.terminating:
                return inst
        return None

    async def _staged(self, p: ClusterPass, primary: Instance, version: str) -> bool | None:
        """Copy the new major's tree onto the primary's volume with an ephemeral container of the new
        image: None while it runs, False once copied, True when it failed."""
        name = f"stage-{version.replace('.', '-')}"
        pod = p.snapshot.find("v1", "Pod", primary.name) or {}
        for st in (pod.get("status") or {}).get("ephemeralContainerStatuses") or ():
            if st.get("name") == name:
                done = (st.get("state") or {}).get("terminated")
                return None if done is None else int(done.get("exitCode", 1)) != 0
        if any(c.get("name") == name for c in objects.spec(pod).get("ephemeralContainers") or ()):
            return None
        target = mu.staged_binaries(version)
        container = {
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
            },
        }
        containers = [*(objects.spec(pod).get("ephemeralContainers") or ()), container]
        await self.api.client.patch(
            Pod.Ephemeralcontainers,
            primary.name,
            {"spec": {"ephemeralContainers": containers}},
            namespace=p.namespace,
            patch_type=PatchType.STRATEGIC,
        )
        return None

    async def _exec(self, p: ClusterPass, pod: str, script: str, seconds: float) -> tuple[int, str] | None:
        assert self.pod_exec is not None
        try:
            res = await self.pod_exec.run(p.namespace, pod, ["/bin/sh", "-c", script], seconds=seconds)
        except (ExecError, TimeoutError) as exc:
            log.info("%s/%s: exec in %s failed: %s", p.namespace, p.name, pod, exc)
            return None
        return res.exit_status, res.output

    async def _pause(self, p: ClusterPass, primary: Instance, pause: bool) -> bool:
        member = self.ha.endpoint(p, primary)
        if member is None:
            return False
        try:
            await patch_config(
                self.ha.session(), member, {"pause": pause}, patroni_auth(p.snapshot, p.cluster)
            )
        except PatroniError as exc:
            log.info("%s/%s: pause=%s refused: %s", p.namespace, p.name, pause, exc)
            return False
        return True

    async def _set_initialize(self, p: ClusterPass, sysid: str) -> None:
        """Patroni's record of the cluster's system identifier (and the old timelines' history) in its
        `<cluster>-config` ConfigMap: the new cluster has a new identifier and starts on timeline 1."""
        patch = {"metadata": {"annotations": {"initialize": sysid, "history": None}}}
        await self.api.merge_patch(ConfigMap, f"{p.name}-config", p.namespace, patch)

    async def _save(
        self, p: ClusterPass, state: dict[str, Any], event_type: str | None, reason: str, message: str
    ) -> None:
        patch = {"metadata": {"annotations": {ANNOTATION: json.dumps(state, sort_keys=True)}}}
        try:
            await self.api.merge_patch(PostgresClusterResource, p.name, p.namespace, patch)
        except ApiError as exc:
            log.warning("%s/%s: could not record the upgrade's state: %s", p.namespace, p.name, exc)
            raise
        p.writes += 1
        self._states[(p.namespace, p.name)] = dict(state)
        if event_type:
            p.writes += int(await self.events.record(p.body, event_type, reason, message))
