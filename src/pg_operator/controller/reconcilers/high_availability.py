"""The high-availability sub-reconciler: the operator's part of high availability on top of Patroni, one step
per reconcile.

- Fast failover: when the kubelet reports the primary's database container dead, release its leader
  key so a replica takes over now rather than after Patroni's ttl (orchestration.failover).
- Wake the Patroni loops that would otherwise sleep out loop_wait: the leader's while a replica streams
  from it but is not yet one of its quorum voters, and after a promotion a member's that must pg_rewind
  once the leader published its checkpoint (orchestration.failover.plan_nudges; a PATCH /config that
  changes nothing, at most once a second and ten times in a row per member).
- Scale-down never removes the primary: the StatefulSet keeps its size until a switchover moved the
  primary to a surviving ordinal (orchestration.rollout.plan_scale).
- Drains: when the primary's node is cordoned or tainted for a drain, a switchover to a replica on a node
  that stays, before the drain may evict the primary (orchestration.drains; reconcilers/drains.py).
- Rolling image changes: replicas first, then a switchover, then the old primary; a stalled instance
  halts the rollout as a reported problem (orchestration.rollout.plan_update).
- Settings: PostgreSQL parameters, synchronous replication and Patroni's timing are kept in Patroni's
  dynamic configuration (PATCH /config on the leader when they differ), values PostgreSQL refuses
  left out and reported (settings_changes.py); members Patroni marks pending_restart are restarted
  replicas first, the primary last, and one that does not come back halts the rollout naming the
  settings (orchestration.rollout.plan_restart).
- Patroni's own ConfigMaps get an owner reference so deleting the cluster removes them too; never one
  that existed before the cluster or has an owner already (it is not this cluster's Patroni's).

The upkeep of Patroni's own objects and loops (fast failover, waking loops, the ConfigMaps' owner) is in
patroni_upkeep.py; how Patroni is reached (HTTPS, its CA, its credentials) in patroni_access.py.

Patroni's REST API is asked only when a decision needs its view (a rollout or switchover in
progress, a promotion or a replica's return), never in steady state: an idle cluster costs no request here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_PRIMARY
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import (
    Api,
    PostgresClusterResource,
    is_not_found,
    resource_for,
)
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler

# patroni_auth: also the major upgrade's (it imports it from here).
from pg_operator.controller.reconcilers.patroni_access import patroni_auth as patroni_auth
from pg_operator.controller.reconcilers.patroni_access import patroni_endpoint
from pg_operator.controller.reconcilers.patroni_upkeep import (
    LoopWaker,
    adopt_patroni_configmaps,
    release_dead_leader,
)
from pg_operator.controller.reconcilers.settings_changes import SettingsChanges
from pg_operator.controller.writes import WriteMemo
from pg_operator.orchestration import requested_restart as restart_request
from pg_operator.orchestration.drains import draining_primary_node, plan_drain
from pg_operator.orchestration.instances import Instance, Member, instances_from_pods, parse_members
from pg_operator.orchestration.requested_switchover import Asked, answered
from pg_operator.orchestration.rollout import Action, best_candidate, plan_restart, plan_scale, plan_update
from pg_operator.patroni.client import (
    Endpoint,
    PatroniError,
    TrustStore,
    get_cluster,
    restart,
    restart_pending,
    switchover,
)
from pg_operator.specs import names

log = logging.getLogger(__name__)

# A planned switchover, asked for on the cluster: `kubectl annotate pgc NAME db.example.com/switchover-to=POD`
# (or `=auto` for the healthiest replica). Cleared once done, or when it cannot be done.
SWITCHOVER_ANNOTATION = "db.example.com/switchover-to"


UNAUTHORIZED = "HTTP 401"  # in a PatroniError: the basic-auth password was refused
# Patroni could not be asked: no CA to verify its certificate with (HTTPS only, no plain-HTTP fallback).
UNVERIFIED_REASON = "PatroniUnverified"
CREDENTIALS_RETRY_SECONDS = 2.0
# A requested switchover Patroni refuses is asked again this often, this many times in all.
SWITCHOVER_RETRY_SECONDS = 5.0
SWITCHOVER_ATTEMPTS = 6
# While a restart rollout runs, how often it looks again whether the restarted member is back.
RESTART_RECHECK_SECONDS = 5.0


@dataclass
class StepResult:
    writes: int = 0
    replicas: int | None = None  # the StatefulSet size to apply now, when it differs from the spec
    problem: tuple[str, str] | None = None
    message: str = ""  # what the data plane is waiting for or doing, for the phase
    # Patroni refused the operator's REST API password: an instance has not reloaded a rotated Secret yet
    # (reconcilers/credentials.py), so the same request will go through once it has.
    credentials_pending: bool = False
    # Patroni refused the requested switchover (e.g. it could not reach the candidate's REST API for a
    # moment, as while an instance reloads its certificates).
    refused: bool = False


@dataclass
class Remembered:
    """What the sub-reconciler remembers of one cluster from one reconcile to the next."""

    halt_told: str | None = None  # the RolloutHalted message last posted
    unverified: str | None = None  # why Patroni could not be asked in this reconcile
    unverified_told: str | None = None  # the PatroniUnverified Warning last posted
    wait_told: str | None = None  # the wait last logged
    refusals: int = 0  # Patroni's refusals of the requested switchover
    asked: Asked | None = None  # the requested switchover put to Patroni


def _desired_image(statefulset: Mapping[str, Any] | None) -> str | None:
    for c in (objects.spec(statefulset).get("template") or {}).get("spec", {}).get("containers") or ():
        if c.get("name") == "postgres":
            return str(c.get("image"))
    return None


class PausedTraffic(Protocol):
    async def resume(self, new_primary: str | None) -> None: ...


class SwitchoverGuard(Protocol):
    async def pause(self, ctx: ReconcileContext) -> PausedTraffic | None: ...


class HighAvailabilityReconciler(SubReconciler):
    def __init__(self, api: Api, events: EventRecorder, pod_exec: PodExec | None = None) -> None:
        self.api = api
        self.events = events
        self._session: aiohttp.ClientSession | None = None
        self.settings = SettingsChanges(events, self.session, pod_exec)
        self.memory: ClusterMemory[Remembered] = ClusterMemory(Remembered)
        self.waker = LoopWaker()
        # Requests answered (annotation cleared) that the cache may still show for a moment: a reconcile right
        # after must not take a stale `auto` for a new request and switch over again.
        self._cleared = WriteMemo()
        self.trust = TrustStore()
        # Pauses what sits in front of the primary around a planned switchover (the pooler sub-reconciler).
        self.switchover_guard: SwitchoverGuard | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.settings.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def act(self, ctx: ReconcileContext) -> None:
        if ctx.statefulset is None:
            return  # nothing runs yet: Patroni bootstraps the first instance on its own
        if ctx.hibernating:
            return  # stopping or starting on purpose, in the lifecycle sub-reconciler's order
        try:
            step = await self.step(ctx)
        except ApiError as exc:
            # A refused action (say, RBAC) is reported, and must not keep the children and the status
            # from being reconciled; the next reconcile tries again.
            log.warning("%s/%s: data-plane action failed: %s", ctx.namespace, ctx.name, exc.status.message)
            step = StepResult(problem=("DataPlaneActionFailed", str(exc.status.message)))
        ctx.writes += step.writes + await self._tell_unverified(ctx)
        ctx.report(step.problem)
        if step.problem is None or step.problem[0] != "RolloutHalted":
            self.memory.of(ctx.key).halt_told = None  # a later halt is news again
        if step.replicas is not None:
            ctx.replicas = step.replicas

    async def _tell_unverified(self, ctx: ReconcileContext) -> int:
        """One Warning Event per message while Patroni cannot be verified (the condition says it on every
        pass); a later failure is news again once it could be asked."""
        memory = self.memory.of(ctx.key)
        message, memory.unverified = memory.unverified, None
        if message is None:
            memory.unverified_told = None
            return 0
        if memory.unverified_told == message:
            return 0
        memory.unverified_told = message
        return int(await self.events.record(ctx.body, "Warning", UNVERIFIED_REASON, message))

    async def step(self, ctx: ReconcileContext) -> StepResult:
        result = StepResult()
        cluster, snapshot = ctx.cluster, ctx.snapshot
        pods = [
            pod for pod in snapshot.of_kind("v1", "Pod") if objects.label(pod, CLUSTER_LABEL) == cluster.name
        ]
        instances = instances_from_pods(pods)
        result.writes += await adopt_patroni_configmaps(self.api, ctx)
        result.writes += await release_dead_leader(self.api, self.events, ctx, instances)
        await self.waker.wake(ctx, instances, self.session(), lambda inst: self.endpoint(ctx, inst),
                              patroni_auth(snapshot, cluster))  # fmt: skip
        result.writes += await self._ensure_dynamic_config(ctx, instances)

        requested = objects.annotation(ctx.body, SWITCHOVER_ANNOTATION)
        if requested:
            result.writes += await self._requested_switchover(ctx, pods, requested, result)
            return result

        # The primary's node is being drained: switch over before the drain may evict it (its budget
        # refuses until then, specs/pdb.py); Patroni's view says which replica may take over.
        # With one instance there is nothing to switch over to (reconcilers/drains.py reports it).
        if len(instances) > 1 and draining_primary_node(instances, pods, snapshot.nodes) is not None:
            planned = instances_from_pods(pods, await self._members(ctx, instances))
            drain = plan_drain(planned, pods, snapshot.nodes)
            if drain is not None:
                result.writes += await self._act(ctx, planned, drain, result)
                return result

        replicas, scale_action = plan_scale(instances, cluster.spec.replicas)
        if replicas != cluster.spec.replicas:
            result.replicas = replicas
        if scale_action.kind != "none":
            members = await self._members(ctx, instances)
            replicas, scale_action = plan_scale(instances_from_pods(pods, members), cluster.spec.replicas)
            result.replicas = replicas if replicas != cluster.spec.replicas else None
            result.writes += await self._act(ctx, instances, scale_action, result)
            return result

        if ctx.fenced & {i.name for i in instances}:  # not ready on purpose: rollouts and restarts wait
            return result  # until it is unfenced rather than halt on it (reconcilers/lifecycle.py)
        image = _desired_image(ctx.statefulset)
        if image and any(i.image != image for i in instances):
            members = await self._members(ctx, instances)
            action = plan_update(
                instances_from_pods(pods, members), image, cluster.spec.replicas, datetime.now(UTC)
            )
            result.writes += await self._act(ctx, instances, action, result)
            return result

        # A recreated pod starts with the current settings, so restarts wait until a rollout is done.
        # A requested restart (kubectl pgc restart) rides the same rollout (orchestration.requested_restart).
        token = objects.annotation(ctx.body, restart_request.RESTART_ANNOTATION)
        if token and restart_request.restart_answered(instances, pods, token):
            result.writes += await self._clear_request(
                ctx, "Normal", "RestartDone", "every instance restarted", restart_request.RESTART_ANNOTATION
            )
            token = ""
        if token:
            instances = restart_request.with_requested_restart(instances, pods, token)
        if any(i.pending_restart is not None for i in instances):
            members = await self._members(ctx, instances)
            planned = instances_from_pods(pods, members)
            planned = restart_request.with_requested_restart(planned, pods, token) if token else planned
            action = plan_restart(planned, cluster.spec.replicas, now=datetime.now(UTC))
            result.writes += await self._act(ctx, planned, action, result)
            if action.kind != "halt":
                # A restarted member streaming again changes no watched object: look again soon rather
                # than at the next resync minutes later (a halted rollout waits for its instance's events).
                ctx.again_in(RESTART_RECHECK_SECONDS)
        return result

    async def hand_over(self, ctx: ReconcileContext, target: str, reason: str) -> bool:
        """A switchover to `target` for another sub-reconciler (fencing the primary), with the pooler held
        around it as for any planned switchover; whether Patroni did it."""
        pods = [p for p in ctx.snapshot.of_kind("v1", "Pod") if objects.label(p, CLUSTER_LABEL) == ctx.name]
        result, action = StepResult(), Action("switchover", target=target, reason=reason)
        writes = await self._act(ctx, instances_from_pods(pods), action, result)
        ctx.writes += writes
        if result.credentials_pending or result.refused or not writes:
            ctx.again_in(SWITCHOVER_RETRY_SECONDS)
        return writes > 0 and not (result.credentials_pending or result.refused)

    async def _requested_switchover(
        self, ctx: ReconcileContext, pods: list[dict[str, Any]], requested: str, result: StepResult
    ) -> int:
        if self._cleared.pending(
            self._request_id(ctx, SWITCHOVER_ANNOTATION), objects.resource_version(ctx.body), requested
        ):
            return 0  # answered a moment ago; the cache has not shown the cleared annotation yet
        instances = instances_from_pods(pods)
        primary = next((i for i in instances if i.role == ROLE_PRIMARY), None)
        memory = self.memory.of(ctx.key)
        done = answered(requested, primary.name if primary else None, memory.asked)
        if done is not None:
            return await self._clear_request(ctx, "Normal", "SwitchoverDone", done)
        members = await self._members(ctx, instances)
        instances = instances_from_pods(pods, members)
        if requested == "auto":
            target = best_candidate(instances)
        else:
            target = next((i for i in instances if i.name == requested), None)
            if target is None:
                return await self._clear_request(
                    ctx, "Warning", "SwitchoverRefused", f"{requested} is not an instance of this cluster"
                )
        if target is None or not target.healthy_replica:
            result.message = f"switchover to {requested} waits for it to be a streaming replica"
            # Patroni's member states come from its REST API; no watched object announces a replica
            # streaming again, so look again soon instead of at the next resync minutes later.
            ctx.again_in(SWITCHOVER_RETRY_SECONDS)
            return 0
        action = Action("switchover", target=target.name, reason=f"switchover to {target.name} requested")
        if primary is not None and (memory.asked is None or memory.asked.requested != requested):
            memory.asked = Asked(requested, primary.name)
        writes = await self._act(ctx, instances, action, result)
        if result.credentials_pending:
            ctx.again_in(
                CREDENTIALS_RETRY_SECONDS
            )  # kept, and asked again soon: no event announces the reload
            return writes
        if result.refused:
            # A refusal is often a moment's (a candidate whose REST API restarts with new certificates,
            # or still catching up): ask again a few times before answering the request with it.
            memory.refusals += 1
            if memory.refusals < SWITCHOVER_ATTEMPTS:
                ctx.again_in(SWITCHOVER_RETRY_SECONDS)
                return writes
        memory.refusals = 0
        # Done, or refused by Patroni every time (its reason is in the SwitchoverRefused Event): either way
        # the request is answered; asking again is the user's call.
        return writes + await self._clear_request(ctx, None, "", "")

    async def _clear_request(
        self,
        ctx: ReconcileContext,
        event_type: str | None,
        reason: str,
        message: str,
        annotation: str = SWITCHOVER_ANNOTATION,
    ) -> int:
        memory = self.memory.of(ctx.key)
        memory.refusals, memory.asked = 0, None
        try:
            await self.api.merge_patch(
                PostgresClusterResource,
                ctx.name,
                ctx.namespace,
                {"metadata": {"annotations": {annotation: None}}},
            )
        except ApiError as exc:
            if not is_not_found(exc):
                raise
        self._cleared.wrote(self._request_id(ctx, annotation), objects.resource_version(ctx.body),
                            objects.annotation(ctx.body, annotation) or "")  # fmt: skip
        recorded = await self.events.record(ctx.body, event_type, reason, message) if event_type else False
        return 1 + int(recorded)

    @staticmethod
    def _request_id(ctx: ReconcileContext, annotation: str) -> tuple[str, str, str, str]:
        return (ctx.namespace, "PostgresCluster", ctx.name, annotation)

    def endpoint(self, ctx: ReconcileContext, inst: Instance) -> Endpoint | None:
        """Where the operator reaches an instance's Patroni: HTTPS verified against the cluster's CA and
        the pod's name under the headless Service, never plain HTTP. None without an IP, or without a CA to
        verify with: then Patroni is not asked, and the reconcile reports why (PatroniUnverified) instead of
        acting on a view it could not check."""
        found = patroni_endpoint(ctx.snapshot, ctx.cluster, inst, self.trust)
        if isinstance(found, str):
            log.info("%s/%s: %s", ctx.namespace, ctx.name, found)
            ctx.report((UNVERIFIED_REASON, found))
            self.memory.of(ctx.key).unverified = found
            return None
        return found

    async def _members(self, ctx: ReconcileContext, instances: list[Instance]) -> dict[str, Member]:
        """Patroni's view, asked of the primary first, then any other running instance."""
        ordered = sorted(instances, key=lambda i: (i.role != ROLE_PRIMARY, i.ordinal))
        for inst in ordered:
            member = self.endpoint(ctx, inst)
            if member is None or inst.container_down:
                continue
            try:
                return parse_members(await get_cluster(self.session(), member))
            except PatroniError as exc:
                log.info("Patroni on %s did not answer: %s", inst.name, exc)
        return {}

    async def _act(
        self, ctx: ReconcileContext, instances: list[Instance], action: Action, result: StepResult
    ) -> int:
        cluster, body = ctx.cluster, ctx.body
        result.message = action.reason
        if action.kind in ("none", "wait"):
            memory = self.memory.of(ctx.key)
            if action.reason and memory.wait_told != action.reason:  # once, not every reconcile
                log.info("%s/%s: %s", cluster.namespace, cluster.name, action.reason)
            memory.wait_told = action.reason
            if action.kind == "wait":
                # Some waits end on Patroni's member state (a replica catching up, streaming), which no
                # watched object announces: look again soon.
                ctx.again_in(SWITCHOVER_RETRY_SECONDS)
            return 0
        if action.kind == "halt":
            result.problem = ("RolloutHalted", action.reason)
            # The condition may have been Degraded for the instance being down already (no new Event
            # then): say why the rollout stopped once per message.
            memory = self.memory.of(ctx.key)
            if memory.halt_told == action.reason:
                return 0
            memory.halt_told = action.reason
            return int(await self.events.record(body, "Warning", "RolloutHalted", action.reason))
        if action.kind == "delete_pod":
            log.info("%s/%s: %s", cluster.namespace, cluster.name, action.reason)
            try:
                await self.api.delete("v1", "Pod", action.target, cluster.namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            return 1 + int(await self.events.record(body, "Normal", "RollingUpdate", action.reason))
        if action.kind == "restart":
            return await self._restart(ctx, instances, action, result)
        # switchover
        primary = next((i for i in instances if i.role == ROLE_PRIMARY), None)
        member = self.endpoint(ctx, primary) if primary is not None else None
        if primary is None or member is None:
            return 0
        auth = patroni_auth(ctx.snapshot, cluster)
        log.info("%s/%s: %s", cluster.namespace, cluster.name, action.reason)
        # The pooler (reconcilers/pooler.py) holds new transactions while Patroni switches over, then sends
        # them to the new primary; it is resumed on every path, the failed ones too.
        paused = await self.switchover_guard.pause(ctx) if self.switchover_guard is not None else None
        switched = False
        try:
            await switchover(self.session(), member, primary.name, action.target, auth)
            switched = True
        except PatroniError as exc:
            if UNAUTHORIZED in str(exc):
                result.credentials_pending = True
                result.message = (
                    f"switchover to {action.target} waits for {primary.name} to load the "
                    f"Patroni API password of Secret {names.patroni_api_secret(cluster)}"
                )
                log.info("%s/%s: %s", cluster.namespace, cluster.name, result.message)
                return 0
            # Patroni says why (e.g. the candidate is not the synchronous standby yet): try again later.
            log.warning("%s/%s: switchover refused: %s", cluster.namespace, cluster.name, exc)
            result.message = f"switchover to {action.target} refused by Patroni; retrying"
            result.refused = True
            return int(await self.events.record(body, "Warning", "SwitchoverRefused", str(exc)))
        finally:
            if paused is not None:
                await paused.resume(action.target if switched else None)
        return int(await self.events.record(body, "Normal", "Switchover", action.reason))

    async def _restart(
        self, ctx: ReconcileContext, instances: list[Instance], action: Action, result: StepResult
    ) -> int:
        cluster = ctx.cluster
        target = next((i for i in instances if i.name == action.target), None)
        member = self.endpoint(ctx, target) if target is not None else None
        if target is None or member is None:
            return 0
        log.info("%s/%s: %s", cluster.namespace, cluster.name, action.reason)
        ask = restart if restart_request.is_requested(target) else restart_pending
        try:
            await ask(self.session(), member, patroni_auth(ctx.snapshot, cluster))
            token = objects.annotation(ctx.body, restart_request.RESTART_ANNOTATION)
            if token:
                await self.api.merge_patch(
                    resource_for("v1", "Pod"),
                    target.name,
                    cluster.namespace,
                    restart_request.restarted_patch(token),
                )
        except PatroniError as exc:
            # Most often the member restarted already and its pod does not say so yet (Patroni checks
            # restart_pending itself); otherwise Patroni says why. Either way: re-plan on the next reconcile.
            log.info("%s/%s: restart of %s not done: %s", cluster.namespace, cluster.name, target.name, exc)
            result.message = f"restart of {target.name} not done by Patroni; retrying"
            return 0
        return int(
            await self.events.record(
                ctx.body, "Normal", "Restarted", action.reason.replace("restarting", "restarted", 1)
            )
        )

    async def _ensure_dynamic_config(self, ctx: ReconcileContext, instances: list[Instance]) -> int:
        """Keep Patroni's dynamic configuration as the spec says, sending only values PostgreSQL
        accepts (controller/reconcilers/settings_changes.py). Patroni then reloads every member; what needs
        a restart shows up as pending_restart on the pods."""
        primary = next(
            (
                i
                for i in instances
                if i.role == ROLE_PRIMARY
                and i.ready
                and i.pod_ip
                and not i.container_down
                and not i.terminating
            ),
            None,
        )
        member = self.endpoint(ctx, primary) if primary is not None else None
        return await self.settings.ensure(ctx, primary, member, patroni_auth(ctx.snapshot, ctx.cluster))
