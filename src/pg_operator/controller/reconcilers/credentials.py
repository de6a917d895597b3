"""The credentials sub-reconciler: the cluster's Secrets (application, superuser, replication, Patroni API)
are the source of truth for every password.

A missing Secret is created with a password from a CSPRNG (create-only: the operator never rewrites a
password). A Secret whose password the database has not been given yet (new, edited, deleted and
recreated, replaced by the user, or a cluster recreated over kept volumes) is applied on the running
primary as a SCRAM verifier sent on stdin (never in argv, never logged), then marked applied on the
Secret (specs/credential_changes.py). The instances pick the new Secret up from their mounts and reload
Patroni (instance/main.py), so replication, pg_rewind and the REST API follow without a restart.

Only the cluster's own Secrets (its controller reference) are read as its credentials and written: a
Secret someone else put at one of these names is a conflict (reconcile.py reports it), never applied to
the database, marked or rewritten — its password would otherwise become a role's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.kube_api import Api, is_conflict
from pg_operator.controller.pod_exec import PSQL, ExecError, PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.writes import Made, WriteMemo, all_of
from pg_operator.controller.writes import create as create_owned
from pg_operator.controller.writes import patch as patch_owned
from pg_operator.specs import ClusterPasswords, build_secrets, names, secret_names
from pg_operator.specs.credential_changes import (
    Change,
    Plan,
    applied_patch,
    plan,
    role_sql,
    stale_app_keys,
    without_verifiers,
)

log = logging.getLogger(__name__)

EXEC_SECONDS = 30


class CredentialsReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder, pod_exec: PodExec | None) -> None:
        self.api = api
        self.memo = memo
        self.events = events
        self.exec = pod_exec
        # Warnings already posted, per cluster: one Event per distinct message.
        self._warned = OncePerMessage(events)

    async def act(self, ctx: ReconcileContext) -> None:
        secrets = {n: ctx.snapshot.find("v1", "Secret", n) for n in secret_names(ctx.cluster)}
        wanted = plan(ctx.cluster, secrets)
        if wanted.refused:
            message = "; ".join(wanted.refused)
            ctx.report(("CredentialRefused", message))
            ctx.writes += await self._warned.warn(ctx.body, "CredentialRefused", message)
        if not wanted.changes:
            ctx.writes += await self._refresh_app_keys(ctx, secrets)
            return
        roles = wanted.role_changes
        if roles:
            primary = ctx.running_primary()
            if primary is None or self.exec is None:
                return  # nothing to apply them to yet: the primary's pod changes wake the cluster
            failure = await self._set_passwords(ctx, primary, roles)
            if failure:
                ctx.report(("CredentialNotApplied", failure))
                ctx.writes += await self._warned.warn(ctx.body, "CredentialNotApplied", failure)
                return
        ctx.writes += await self._mark_applied(ctx, wanted, secrets)

    async def _refresh_app_keys(
        self, ctx: ReconcileContext, secrets: Mapping[str, Mapping[str, Any] | None]
    ) -> int:
        """The application Secret's URIs follow its (applied) password and today's form."""
        name = names.app_secret(ctx.cluster)
        patch = stale_app_keys(ctx.cluster, secrets.get(name))
        if patch is None:
            return 0
        try:
            await patch_owned(self.api, ctx.claims, Secret, secrets.get(name), patch)
        except ApiError as exc:
            if not is_conflict(exc):
                raise
        return 1

    async def _set_passwords(self, ctx: ReconcileContext, primary: str, changes: list[Change]) -> str | None:
        """ALTER ROLE … PASSWORD '<verifier>' for each change, in one psql session; a reason on failure."""
        assert self.exec is not None
        what = ", ".join(c.describe() for c in changes)
        try:
            result = await self.exec.run(ctx.namespace, primary, [*PSQL, "-q", "-f", "-"],
                                         stdin=role_sql(changes).encode(), seconds=EXEC_SECONDS)  # fmt: skip
        except ExecError as exc:
            return f"could not set {what} on {primary}: {exc}"
        if result.exit_status != 0:
            why = without_verifiers(result.stderr)[-300:] or f"psql exited {result.exit_status}"
            return f"could not set {what} on {primary}: {why}"
        log.info("%s/%s: set %s on %s", ctx.namespace, ctx.name, what, primary)
        return None

    async def _mark_applied(
        self, ctx: ReconcileContext, wanted: Plan, secrets: Mapping[str, Mapping[str, Any] | None]
    ) -> int:
        async def mark(change: Change) -> int:
            secret = secrets[change.slot.secret] or {}
            try:
                if not await patch_owned(self.api, ctx.claims, Secret, secret,
                                          applied_patch(ctx.cluster, change, secret)):  # fmt: skip
                    return 1  # gone or replaced meanwhile: its watch event brings the next reconcile
            except ApiError as exc:
                if is_conflict(exc):
                    return 1  # changed meanwhile: its watch event brings the next reconcile
                raise
            if change.slot.has_role:
                message = f"{change.describe()} was set in the database"
            else:
                message = f"{change.describe()} changed; the instances reload it from their mounted Secret"
            await self.events.record(ctx.body, "Normal", "CredentialApplied", message)
            return 2

        return await all_of([mark(c) for c in wanted.changes])

    async def create(self, ctx: ReconcileContext) -> int:
        names = secret_names(ctx.cluster)
        ctx.wanted.update(("v1", "Secret", n) for n in names)
        missing = [
            n
            for n in names
            if ctx.snapshot.find("v1", "Secret", n) is None and not ctx.claims.blocked(("v1", "Secret", n))
        ]  # a foreign one there: a conflict
        for present in set(names) - set(missing):
            self.memo.seen((ctx.namespace, "Secret", present, "create"))
        missing = [
            n for n in missing if not self.memo.pending((ctx.namespace, "Secret", n, "create"), None, "")
        ]
        if not missing:
            return 0

        async def create(secret: dict[str, Any]) -> int:
            secret_name = secret["metadata"]["name"]
            log.info("creating Secret %s/%s", ctx.namespace, secret_name)
            made, _ = await create_owned(self.api, ctx.claims, secret)
            if made is Made.OURS:
                # The cluster's own, yet not in the cache, which holds only Secrets labelled with the
                # cluster: someone took the label off (asked again each reconcile, so the report stays).
                ctx.report(
                    (
                        "CredentialUnlabelled",
                        f"Secret {secret_name} lacks the label {CLUSTER_LABEL}={ctx.name}: the operator "
                        "cannot see its password; label it again to have it applied",
                    )
                )
            elif made is Made.CREATED:
                self.memo.wrote((ctx.namespace, "Secret", secret_name, "create"), None, "")
            return 1  # a foreign one is the reconcile's to report (a conflict in the claims)

        # Passwords only exist in these objects and in the request body; never logged.
        secrets = build_secrets(ctx.cluster, ClusterPasswords.generate())
        return await all_of([create(s) for s in secrets if s["metadata"]["name"] in missing])
