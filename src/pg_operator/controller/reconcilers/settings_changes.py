"""Settings changes on a running cluster, the high-availability sub-reconciler's part that talks to
PostgreSQL: keep Patroni's dynamic configuration as the spec says, but send only values PostgreSQL accepts,
and tell the user only what really took effect (orchestration.parameter_check decides; this is the glue).

Per pass: the parameters that differ from what Patroni holds are judged by `postgres -C` in the
primary's container (once per cluster, image and value: the verdicts are kept); refused ones are left
out of the PATCH and reported (Degraded `ParameterRefused`, a Warning Event once per message); after
the PATCH the sent values are read back from pg_settings on the primary until each is in effect or
waits for a restart (at most VERIFY_WITHIN), and only then the ConfigurationUpdated Event says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pg_operator import objects
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import load_config
from pg_operator.controller.pod_exec import PSQL, ExecError, PodExec
from pg_operator.controller.reconcilers import Problem, ReconcileContext
from pg_operator.orchestration.instances import Instance
from pg_operator.orchestration.parameter_check import (
    CHECK_ARGV,
    Applied,
    Verdict,
    applied_message,
    check_input,
    new_values,
    parse_check_output,
    read_back,
    refusal_message,
    value_text,
    verify_query,
    without_refused,
)
from pg_operator.orchestration.patroni_settings import (
    changed_parameter_names,
    config_configmap_name,
    dynamic_config,
    dynamic_config_patch,
)
from pg_operator.patroni.client import Endpoint, PatroniAuth, PatroniError, patch_config
from pg_operator.specs.configmap import dynamic_settings

log = logging.getLogger(__name__)

# Patroni reloads every member in its next loop (loop_wait, 10 s by default); a value not in effect
# after this long is reported as such.
VERIFY_WITHIN = 60.0
VERIFY_EVERY = 2.0
REFUSED_REASON = "ParameterRefused"
CHECK_FAILED_REASON = "ParameterCheckFailed"

ClusterKey = tuple[str, str]
VerdictKey = tuple[str, str, str]  # (image, name, value)


@dataclass
class Unverified:
    """Values sent to Patroni and not yet seen in effect on the primary."""

    expected: dict[str, str]  # name → the setting `postgres -C` parsed the value to
    removed: list[str]
    since: float


@dataclass
class _ClusterMemory:
    verdicts: dict[VerdictKey, Verdict] = field(default_factory=dict)
    told: str = ""  # the refusal message last posted as an Event
    patched_version: str | None = None  # the `<scope>-config` version last PATCHed at
    unverified: Unverified | None = None
    reader: asyncio.Task[None] | None = None  # reads the sent values back (nothing else wakes a reconcile)


def _stop_reader(key: ClusterKey, memory: _ClusterMemory) -> None:
    if memory.reader is not None:
        memory.reader.cancel()


class SettingsChanges(RemembersClusters):
    def __init__(
        self,
        events: EventRecorder,
        session: Callable[[], aiohttp.ClientSession],
        pod_exec: PodExec | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.events = events
        self.session = session
        self._exec = pod_exec
        self._own_exec = False  # made here (no shared one given): closed here too
        self.clock = clock
        self._memory: ClusterMemory[_ClusterMemory] = ClusterMemory(_ClusterMemory, on_forget=_stop_reader)

    def pod_exec(self) -> PodExec:
        if self._exec is None:
            try:
                self._exec = PodExec(load_config())
                self._own_exec = True
            except SystemExit as exc:  # load_config's way of saying there is no configuration
                raise ExecError(str(exc)) from None
        return self._exec

    async def close(self) -> None:
        for memory in self._memory.values():
            if memory.reader is not None:
                memory.reader.cancel()
        if self._exec is not None and self._own_exec:
            await self._exec.close()

    async def ensure(
        self,
        ctx: ReconcileContext,
        primary: Instance | None,
        member: Endpoint | None,
        auth: PatroniAuth | None,
    ) -> int:
        """One pass: check, PATCH what is accepted, read back what was sent. Returns the writes made."""
        key = (ctx.namespace, ctx.name)
        memory = self._memory.of(key)
        writes = 0
        configmap = ctx.snapshot.find("v1", "ConfigMap", config_configmap_name(ctx.name))
        desired = dynamic_settings(ctx.cluster)
        patch = dynamic_config_patch(configmap, desired)
        if patch is None or primary is None or member is None:
            if patch is None and memory.told:
                memory.told = ""  # nothing refused any more: a later refusal is news again
            return writes
        values = new_values(patch)
        verdicts = await self._judge(ctx, memory, primary, values)
        refused = {n: v.reason for n, v in verdicts.items() if not v.accepted and not v.unknown}
        unknown = {n: v.reason for n, v in verdicts.items() if v.unknown}
        writes += await self._report(ctx, memory, refused, unknown)
        if refused or unknown:
            patch = dynamic_config_patch(
                configmap, without_refused(desired, dynamic_config(configmap), {*refused, *unknown})
            )
        elif memory.told:
            memory.told = ""
        if patch is None:
            return writes
        version = objects.resource_version(configmap) or ""
        if memory.patched_version == version:
            return writes  # sent at this version already; Patroni has not written it back yet
        try:
            await patch_config(self.session(), member, patch, auth)
        except PatroniError as exc:
            log.warning(
                "%s/%s: could not update Patroni's dynamic configuration: %s", ctx.namespace, ctx.name, exc
            )
            return writes
        memory.patched_version = version
        return writes + await self._sent(ctx, memory, patch, verdicts, primary.name)

    async def _judge(
        self, ctx: ReconcileContext, memory: _ClusterMemory, primary: Instance, values: Mapping[str, Any]
    ) -> dict[str, Verdict]:
        """PostgreSQL's verdict on each value, asked of the primary's binary only for values not judged
        before on this image."""
        image = primary.image or ""
        keys = {name: (image, name, value_text(value)) for name, value in values.items()}
        memory.verdicts = {k: v for k, v in memory.verdicts.items() if k in keys.values()}
        missing = {name: values[name] for name, k in keys.items() if k not in memory.verdicts}
        if missing:
            try:
                result = await self.pod_exec().run(
                    ctx.namespace, primary.name, CHECK_ARGV, stdin=check_input(missing), seconds=30
                )
                judged = parse_check_output(missing, result.stdout)
            except ExecError as exc:
                judged = {
                    name: Verdict(False, unknown=True, reason=f"could not check {name}: {exc}")
                    for name in missing
                }
            for name, verdict in judged.items():
                if not verdict.unknown:  # a check that did not run is tried again next reconcile
                    memory.verdicts[keys[name]] = verdict
            found = {**{n: memory.verdicts[k] for n, k in keys.items() if k in memory.verdicts}, **judged}
        else:
            found = {n: memory.verdicts[k] for n, k in keys.items()}
        return found

    async def _report(
        self,
        ctx: ReconcileContext,
        memory: _ClusterMemory,
        refused: Mapping[str, str],
        unknown: Mapping[str, str],
    ) -> int:
        problem: Problem | None = None
        if refused:
            problem = (REFUSED_REASON, refusal_message(refused))
        elif unknown:
            problem = (
                CHECK_FAILED_REASON,
                "spec.postgresql.parameters: not sent to the instances until "
                "PostgreSQL has checked them: " + "; ".join(sorted(unknown.values())),
            )
        if problem is None:
            return 0
        ctx.report(problem)
        if not refused or memory.told == problem[1]:
            return 0
        memory.told = problem[1]
        log.warning("%s/%s: %s", ctx.namespace, ctx.name, problem[1])
        return int(await self.events.record(ctx.body, "Warning", REFUSED_REASON, problem[1]))

    async def _sent(
        self,
        ctx: ReconcileContext,
        memory: _ClusterMemory,
        patch: Mapping[str, Any],
        verdicts: Mapping[str, Verdict],
        primary: str,
    ) -> int:
        settings = sorted(k for k in patch if k != "postgresql")
        parameters = changed_parameter_names(patch)
        sent = new_values(patch)
        log.info(
            "%s/%s: updated Patroni's dynamic configuration: %s",
            ctx.namespace,
            ctx.name,
            ", ".join(settings + [f"parameter {n}" for n in parameters]),
        )
        if sent or len(parameters) > len(sent):
            memory.unverified = Unverified(
                expected={n: verdicts[n].setting for n in sent if n in verdicts},
                removed=[n for n in parameters if n not in sent],
                since=self.clock(),
            )
            if memory.reader is None or memory.reader.done():
                memory.reader = asyncio.create_task(self._read_back_until_known(ctx, memory, primary))
        user_settings = [s for s in settings if s != "primary_start_timeout"]
        if not user_settings:
            return 0  # the parameters are told once read back; the operator's own setting is not news
        recorded = await self.events.record(
            ctx.body,
            "Normal",
            "ConfigurationUpdated",
            "Patroni's dynamic configuration now holds " + ", ".join(user_settings),
        )
        return int(recorded)

    async def _read_back_until_known(
        self, ctx: ReconcileContext, memory: _ClusterMemory, primary: str
    ) -> None:
        """Runs beside the reconciles after a PATCH (on the primary it went to): Patroni's reload changes
        no object the operator watches, so no reconcile would come to look. Ends once the Event is posted."""
        try:
            while memory.unverified is not None:
                await asyncio.sleep(VERIFY_EVERY)
                await self._read_back(ctx, memory, primary)
        except asyncio.CancelledError:
            raise
        except Exception:  # an Event must never take the operator down
            log.exception("%s/%s: reading settings back failed", ctx.namespace, ctx.name)

    async def _read_back(self, ctx: ReconcileContext, memory: _ClusterMemory, primary: str) -> None:
        """Read the values sent last from pg_settings on the primary; once each is in effect or waits
        for a restart (or VERIFY_WITHIN passed), post the ConfigurationUpdated Event saying which."""
        pending = memory.unverified
        if pending is None:
            return
        now = self.clock()
        result = Applied()
        if pending.expected:
            out = None
            if primary:
                try:
                    out = await self.pod_exec().run(
                        ctx.namespace, primary, [*PSQL, "-c", verify_query(pending.expected)], seconds=20
                    )
                except ExecError as exc:
                    log.info("%s/%s: reading settings back: %s", ctx.namespace, ctx.name, exc)
            if out is None or out.exit_status != 0:
                if now - pending.since < VERIFY_WITHIN:
                    return
                result = Applied(not_yet=tuple(sorted(pending.expected)))
            else:
                result = read_back(pending.expected, out.stdout)
        if result.not_yet and now - pending.since < VERIFY_WITHIN:
            return
        memory.unverified = None
        message = applied_message(result, primary or "the primary", pending.removed)
        if not message:
            return
        event_type = "Warning" if result.not_yet else "Normal"
        reason = "ParameterNotApplied" if result.not_yet else "ConfigurationUpdated"
        await self.events.record(ctx.body, event_type, reason, message)
