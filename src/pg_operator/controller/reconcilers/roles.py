"""The roles sub-reconciler: `spec.roles` and `spec.databases` kept in the database as declared.

A check reads what the primary holds (one psql over pod exec, read-only, specs/role_reads.py: roles,
memberships, password verifiers of the declared roles, databases, extensions, schemas; inside the declared
databases, which tenants own, as the monitoring role rather than the superuser), plans the SQL that
converges it (specs/role_changes.py) and, only when something differs, runs that SQL in a second exec —
verifiers, never passwords, on stdin; nothing of it in argv, a log line or an Event. A check runs when
something that could change the answer changed (the cluster's generation, the primary, a password Secret's
version) and otherwise at most every `CHECK_SECONDS`, which bounds how long a role altered or dropped by
hand stays so: a steady cluster costs one read-only exec per interval and no write; a cluster that
declares nothing (and has nothing left to release) costs nothing.

Generated role Secrets (`<cluster>-<role>`) are created once with a CSPRNG password, owned by the cluster;
their derived keys (URIs, pgpass, ca.crt) follow the password and the cluster's CA. A Secret the user
names is read, never written: the database's verifier is the applied mark (specs/roles.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.kube_api import Api, is_conflict
from pg_operator.controller.pod_exec import PSQL, ExecError, PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.writes import Made, WriteMemo, all_of
from pg_operator.controller.writes import create as create_owned
from pg_operator.controller.writes import patch as patch_owned
from pg_operator.specs import names
from pg_operator.specs.role_changes import converge, without_secrets
from pg_operator.specs.role_reads import READ_ROLE, ObservationError, Observed, observe_sql, observed_of
from pg_operator.specs.roles import (
    DATABASES_CONDITION,
    ROLES_CONDITION,
    Entry,
    conditions,
    declared_databases,
    declared_roles,
    declares_anything,
    generates_secret,
    new_password,
    orphan_patch,
    password_sources,
    passwords,
    released_secrets,
    role_secret,
    role_secret_name,
    stale_keys,
)
from pg_operator.specs.secrets import APP_CA_KEY, decoded

log = logging.getLogger(__name__)

# How long a role or database changed by hand may stay so before the next check puts it back.
CHECK_SECONDS = 60.0
# After a failed check or apply.
RETRY_SECONDS = 15.0
EXEC_SECONDS = 60
CONDITION_TYPES = (ROLES_CONDITION, DATABASES_CONDITION)


@dataclass
class _Checked:
    """The last check of one cluster."""

    trigger: tuple[Any, ...]
    at: float
    roles: list[Entry] = field(default_factory=list)
    databases: list[Entry] = field(default_factory=list)
    failure: str | None = None  # the check or the apply failed: why (no secret in it)
    # Declared databases the read could not enter: read last next time, so one that refuses the read
    # role cannot keep the others from being read.
    unread: frozenset[str] = frozenset()


class RolesReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder, pod_exec: PodExec | None) -> None:
        self.api = api
        self.memo = memo
        self.events = events
        self.exec = pod_exec
        self._checked: ClusterMemory[_Checked] = ClusterMemory()
        self._warned = OncePerMessage(events)
        # The primaries whose declared databases were read as the superuser (an instance whose pg_hba
        # does not admit the read role yet), per cluster: said once in the log, not every check.
        self._read_as_superuser: ClusterMemory[set[str]] = ClusterMemory(set)

    # --- data plane -------------------------------------------------------------------------------------

    async def act(self, ctx: ReconcileContext) -> None:
        key = (ctx.namespace, ctx.name)
        if not declares_anything(ctx.cluster) and not self._left_to_release(ctx):
            self._checked.drop(key)
            return
        ctx.writes += await self._refresh_secrets(ctx)
        primary = ctx.running_primary()
        if primary is None or self.exec is None:
            return  # the primary's pod changes wake the cluster
        secrets = {objects.name(s): s for s in ctx.snapshot.of_kind("v1", "Secret")}
        trigger = (
            ctx.cluster.generation,
            primary,
            tuple((n, objects.resource_version(secrets.get(n))) for n in password_sources(ctx.cluster)),
        )
        last = self._checked.get(key)
        now = time.monotonic()
        if last is not None and last.trigger == trigger:
            wait = (RETRY_SECONDS if last.failure else CHECK_SECONDS) - (now - last.at)
            if wait > 0:
                ctx.again_in(wait)
                return
        checked = await self._check(ctx, primary, trigger, secrets, last.unread if last else frozenset())
        self._checked.set(key, checked)
        ctx.again_in(RETRY_SECONDS if checked.failure else CHECK_SECONDS)
        problems = ([checked.failure] if checked.failure else []) + [
            f"{kind} {e.name}: {e.reason}"
            for kind, entries in (("role", checked.roles), ("database", checked.databases))
            for e in entries
            if not e.applied and not e.reason.startswith("waiting for")
        ]
        if problems:
            ctx.writes += await self._warned.warn(ctx.body, "RolesNotApplied", "; ".join(problems)[:2000])

    def _left_to_release(self, ctx: ReconcileContext) -> bool:
        """Nothing is declared, but the last check or status still lists roles or databases (removed from
        the spec: the removal policy is still to be applied, or a removal was refused)."""
        last = self._checked.get((ctx.namespace, ctx.name))
        if last is not None:
            return bool(last.roles or last.databases)
        status = ctx.body.get("status") or {}
        return bool(status.get("roles") or status.get("databases"))

    async def _check(
        self,
        ctx: ReconcileContext,
        primary: str,
        trigger: tuple[Any, ...],
        secrets: dict[str, dict[str, Any]],
        read_last: frozenset[str],
    ) -> _Checked:
        assert self.exec is not None
        checked = _Checked(trigger, time.monotonic())
        try:
            script = observe_sql(ctx.cluster, read_last).encode()
            result = await self.exec.run(ctx.namespace, primary, [*PSQL, "-q", "-f", "-"],
                                         stdin=script, seconds=EXEC_SECONDS)  # fmt: skip
            # psql ends where the read role is refused: what it read before counts (the database is
            # reported); any other failure fails the check.
            observed = observed_of(result.exit_status, result.stdout, result.stderr)
            if observed is None:
                why = without_secrets(result.stderr)[-300:] or f"psql exited {result.exit_status}"
                checked.failure = f"could not read roles and databases on {primary}: {why}"
                return checked
        except (ExecError, ObservationError) as exc:
            checked.failure = f"could not read roles and databases on {primary}: {exc}"
            return checked
        self._log_read(ctx, primary, observed, result.stderr)
        checked.unread = frozenset(n for n, d in observed.databases.items() if d.unread is not None)
        try:
            plan = converge(ctx.cluster, observed, passwords(ctx.cluster, secrets))
        except ValueError as exc:  # a name the plan refuses to put on a psql line
            checked.failure = f"could not plan roles and databases: {exc}"
            return checked
        checked.roles, checked.databases = plan.roles, plan.databases
        if not plan.script:
            return checked
        what = "; ".join(plan.changes)[:1500] or "marked managed roles and databases"
        try:
            result = await self.exec.run(ctx.namespace, primary, [*PSQL, "-q", "-f", "-"],
                                         stdin=plan.sql.encode(), seconds=EXEC_SECONDS)  # fmt: skip
        except ExecError as exc:
            checked.failure = f"could not apply roles and databases on {primary}: {exc}"
            return checked
        if result.exit_status != 0:
            why = without_secrets(result.stderr)[-400:] or f"psql exited {result.exit_status}"
            checked.failure = f"could not apply roles and databases on {primary}: {why}"
            # Nothing is known to be applied now: every entry says so until the next check.
            checked.roles = [Entry(e.name, False, e.reason or "the SQL failed") for e in checked.roles]
            checked.databases = [
                Entry(e.name, False, e.reason or "the SQL failed") for e in checked.databases
            ]
            return checked
        log.info("%s/%s: %s", ctx.namespace, ctx.name, what)
        ctx.writes += int(await self.events.record(ctx.body, "Normal", "RolesConverged", what))
        return checked

    def _log_read(self, ctx: ReconcileContext, primary: str, observed: Observed, stderr: str) -> None:
        read_as_superuser = self._read_as_superuser.of(ctx.key)
        if observed.databases_read_as != READ_ROLE and primary not in read_as_superuser:
            read_as_superuser.add(primary)
            log.info("%s/%s: read the declared databases on %s as %s (pinned), not as %s: the instance's "
                     "pg_hba does not admit %s to them (an older image; it does once the pod is rolled)",
                     ctx.namespace, ctx.name, primary, observed.databases_read_as, READ_ROLE,
                     READ_ROLE)  # fmt: skip
        elif observed.databases_read_as == READ_ROLE:
            read_as_superuser.discard(primary)
        if observed.stopped_at is not None:
            log.warning("%s/%s: %s was refused in database %s on %s, the read stopped there: %s",
                        ctx.namespace, ctx.name, observed.databases_read_as, observed.stopped_at, primary,
                        without_secrets(stderr)[-300:])  # fmt: skip

    # --- generated Secrets ------------------------------------------------------------------------------

    def _ca(self, ctx: ReconcileContext) -> str | None:
        return decoded(ctx.snapshot.find("v1", "Secret", names.app_secret(ctx.cluster)), APP_CA_KEY)

    async def _refresh_secrets(self, ctx: ReconcileContext) -> int:
        """Generated Secrets' derived keys follow their password, the cluster and its trusted CAs. Only
        the cluster's own (the snapshot holds no other at their names; patch_owned pins each to its
        uid)."""
        ca = self._ca(ctx)
        patches = []
        for role in declared_roles(ctx.cluster):
            if not generates_secret(role):
                continue
            name = role_secret_name(ctx.cluster, role.name)
            secret = ctx.snapshot.find("v1", "Secret", name)
            patch = stale_keys(ctx.cluster, role.name, secret, ca)
            if patch is not None and secret is not None:
                patches.append((secret, patch))

        async def send(secret: dict[str, Any], patch: dict[str, Any]) -> int:
            try:
                await patch_owned(self.api, ctx.claims, Secret, secret, patch)
            except ApiError as exc:
                if not is_conflict(exc):
                    raise
            return 1

        return await all_of([send(secret, patch) for secret, patch in patches])

    async def _release_secrets(self, ctx: ReconcileContext) -> int:
        """The generated Secret of a role no longer declared: with removal policy retain the role keeps its
        password, so the Secret is handed over (no owner, no labels) rather than deleted; with delete it is
        left to the deletion of undesired children."""
        if ctx.cluster.spec.removal_policy.roles != "retain":
            return 0
        # Only the cluster's own: a Secret someone else labelled like one is not the cluster's to hand over.
        ours = [s for s in ctx.snapshot.of_kind("v1", "Secret") if ctx.claims.ours(s)]
        released = released_secrets(ctx.cluster, ours)
        # kept this reconcile; gone from the cache after
        ctx.wanted.update(("v1", "Secret", n) for n in released)

        async def release(name: str) -> int:
            secret = ctx.snapshot.find("v1", "Secret", name) or {}
            log.info(
                "handing Secret %s/%s over: its role is no longer declared (retain)", ctx.namespace, name
            )
            try:
                if not await patch_owned(self.api, ctx.claims, Secret, secret, orphan_patch(secret)):
                    return 1
            except ApiError as exc:
                if not is_conflict(exc):
                    raise
                return 1
            await self.events.record(ctx.body, "Normal", "RoleSecretReleased",
                                     f"Secret {name} is no longer managed: its role was removed from "
                                     "spec.roles and retained; the Secret is yours now")  # fmt: skip
            return 2

        return await all_of([release(n) for n in released])

    async def create(self, ctx: ReconcileContext) -> int:
        writes = await self._release_secrets(ctx)
        wanted = [
            role_secret_name(ctx.cluster, r.name) for r in declared_roles(ctx.cluster) if generates_secret(r)
        ]
        ctx.wanted.update(("v1", "Secret", n) for n in wanted)
        missing = []
        for role in declared_roles(ctx.cluster):
            if not generates_secret(role):
                continue
            name = role_secret_name(ctx.cluster, role.name)
            ident = (ctx.namespace, "Secret", name, "create")
            if ctx.snapshot.find("v1", "Secret", name) is not None:
                self.memo.seen(ident)
            elif ctx.claims.blocked(("v1", "Secret", name)):
                continue  # someone else's Secret holds the name: a conflict, left alone
            elif not self.memo.pending(ident, None, ""):
                missing.append((role.name, name, ident))
        if not missing:
            return writes
        ca = self._ca(ctx)

        async def create(role: str, name: str, ident: tuple[str, str, str, str]) -> int:
            log.info("creating Secret %s/%s for role %s", ctx.namespace, name, role)
            made, _ = await create_owned(
                self.api, ctx.claims, role_secret(ctx.cluster, role, new_password(), ca)
            )
            if made is Made.OURS:
                ctx.report(
                    (
                        "RoleSecretUnlabelled",
                        f"Secret {name} lacks the label {CLUSTER_LABEL}={ctx.name}: the operator cannot see "
                        f"the password of role {role}; label it again, or delete it to have one "
                        "generated",
                    )
                )
            elif made is Made.CREATED:
                self.memo.wrote(ident, None, "")
            return 1  # a foreign one is a conflict in the claims, reported by the reconcile

        return writes + await all_of([create(*m) for m in missing])

    # --- status -----------------------------------------------------------------------------------------

    def status(self, ctx: ReconcileContext, status: dict[str, Any]) -> None:
        """status.roles, status.databases and the RolesApplied / DatabasesApplied conditions."""
        previous = ctx.body.get("status") or {}
        checked = self._checked.get((ctx.namespace, ctx.name))
        if checked is None:
            if not declares_anything(ctx.cluster):
                return
            if previous.get("roles") is not None or previous.get("databases") is not None:
                # Not checked since the operator started: what the last one found stands.
                for key in ("roles", "databases"):
                    if previous.get(key):
                        status[key] = previous[key]
                status["conditions"] = [
                    *status.get("conditions", []),
                    *(dict(c) for c in previous.get("conditions") or () if c.get("type") in CONDITION_TYPES),
                ]
                return
            waiting = "not checked yet: waiting for a running primary"
            roles = [Entry(r.name, False, waiting) for r in declared_roles(ctx.cluster)]
            dbs = [Entry(d.name, False, waiting) for d in declared_databases(ctx.cluster)]
            failure = None
        else:
            roles, dbs, failure = checked.roles, checked.databases, checked.failure
        if roles:
            status["roles"] = [e.as_status() for e in roles]
        if dbs:
            status["databases"] = [e.as_status() for e in dbs]
        if not roles and not dbs and not declares_anything(ctx.cluster) and failure is None:
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        added = []
        for type_, ok, reason, message in conditions(roles, dbs):
            if failure is not None:
                ok, reason, message = False, "CheckFailed", failure[:4000]
            value = "True" if ok else "False"
            since = now
            for old in previous.get("conditions") or ():
                same = old.get("type") == type_ and old.get("status") == value
                if same and old.get("lastTransitionTime"):
                    since = str(old["lastTransitionTime"])
            added.append({"type": type_, "status": value, "reason": reason, "message": message,
                          "observedGeneration": ctx.cluster.generation,
                          "lastTransitionTime": since})  # fmt: skip
        status["conditions"] = [*status.get("conditions", []), *added]
