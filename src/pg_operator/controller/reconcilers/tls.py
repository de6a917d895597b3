"""The TLS sub-reconciler: the cluster's certificate authority and the instances' server certificate, issued
and renewed by the operator (specs/tls.py), and the CA's rotation through a bundle (specs/ca_rotation.py).
The CA is created once; the server certificate is re-issued when a third of its life is left, when the
names it must carry change, or when the CA that should sign it or the CAs to trust changed. The
instances reload a renewed certificate without a restart (instance/main.py). The sub-reconciler also reports
when each certificate in use expires (a gauge per certificate) and, as Degraded `CertificateExpiring` with a
Warning Event, one that comes within three weeks of its end without having been renewed.

Only the cluster's own Secrets are read as its CA and certificates and written (controller/writes.py):
a foreign Secret at the CA's name stops every issue (a certificate signed by a CA that cannot be stored
would be re-issued on every reconcile), one at another name is left alone and reported as a conflict."""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret
from prometheus_client import CollectorRegistry, Gauge

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, REPLICATION_USER
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.kube_api import Api, is_conflict
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.writes import Made, WriteMemo, all_of
from pg_operator.controller.writes import create as create_owned
from pg_operator.controller.writes import patch as patch_owned
from pg_operator.orchestration.instances import instance_from_pod, loaded_tls
from pg_operator.specs import names
from pg_operator.specs.ca_rotation import (
    ROTATE_CA_ANNOTATION,
    TRUST_PERIOD,
    Authority,
    Plan,
    authority_from_secret,
    authority_patch,
    authority_secret,
    finish,
    plan,
    replication_ca_from_secret,
    replication_ca_patch,
    secret_digest,
    start,
)
from pg_operator.specs.ownership import controlled_by
from pg_operator.specs.secrets import APP_CA_KEY
from pg_operator.specs.services import assigned_addresses
from pg_operator.specs.tls import (
    CA_CERT_KEY,
    REPLICATION_CA_KEY,
    REPLICATION_CERT_KEY,
    REPLICATION_KEY_KEY,
    TRUST_CHANGED,
    KeyPair,
    ReplicationTrust,
    b64,
    certificates_in_use,
    expiring,
    issue_client,
    issue_server,
    new_ca,
    new_replication_ca,
    pem_certificates,
    replication_trust,
    secret_bytes,
    server_renewal,
    server_secret,
    tls_secret_names,
    trust_while_leaves_change,
)
from pg_operator.specs.user_tls import (
    USER_CERTIFICATE_CHANGED,
    UserServer,
    trust_bundle,
    user_ca,
    user_server,
    user_server_renewal,
)

log = logging.getLogger(__name__)


class CertificateMetrics(RemembersClusters):
    """`pg_operator_certificate_expiry_timestamp_seconds`: when each certificate a cluster uses ends (Unix
    time), so an alert can fire well before; a cluster's series go with it."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.expiry = Gauge(
            "pg_operator_certificate_expiry_timestamp_seconds",
            "When a cluster's certificate expires (Unix time), by role: ca, server, replication.",
            ["namespace", "cluster", "certificate", "secret"],
            registry=registry,
        )
        # The series each cluster has, removed when it is gone.
        self._series: ClusterMemory[set[tuple[str, str]]] = ClusterMemory(on_forget=self._remove)

    def _remove(self, key: tuple[str, str], series: set[tuple[str, str]]) -> None:
        for role, secret in series:
            self.expiry.remove(key[0], key[1], role, secret)

    def set(self, key: tuple[str, str], ends: dict[str, tuple[str, dt.datetime]]) -> None:
        """`ends`: role → (Secret, expiry)."""
        series = {(role, secret) for role, (secret, _) in ends.items()}
        self._remove(key, (self._series.drop(key) or set()) - series)
        for role, (secret, end) in ends.items():
            self.expiry.labels(namespace=key[0], cluster=key[1], certificate=role, secret=secret).set(
                end.timestamp()
            )
        if series:
            self._series.set(key, series)


class TlsReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 registry: CollectorRegistry | None = None,
                 ca_trust_period: dt.timedelta = TRUST_PERIOD) -> None:  # fmt: skip
        self.api = api
        self.ca_trust_period = ca_trust_period
        self.memo = memo
        self.events = events
        self.clock = clock
        self.metrics = CertificateMetrics(registry)
        self._warned = OncePerMessage(events)  # CertificateExpiring
        self._refused: ClusterMemory[str] = ClusterMemory()  # the TlsSecretInvalid message last posted

    async def follow_up(self, ctx: ReconcileContext) -> int:
        """Report what the cache shows in use: the expiry gauge, and a certificate near its end that was
        not renewed as a problem with one Warning per distinct message."""
        ca_name, server_name = tls_secret_names(ctx.cluster)
        in_use = certificates_in_use(ctx.snapshot.find("v1", "Secret", ca_name),
                                     ctx.snapshot.find("v1", "Secret", server_name))  # fmt: skip
        self.metrics.set((ctx.namespace, ctx.name), {role: (ca_name if role == "ca" else server_name, end)
                                                 for role, end in in_use.items()})  # fmt: skip
        message = expiring(in_use, self.clock())
        key = (ctx.namespace, ctx.name)
        if message is None:
            self._warned.forget(key)
            return 0
        ctx.report(("CertificateExpiring", message))
        return await self._warned.warn(ctx.body, "CertificateExpiring", message)

    async def create(self, ctx: ReconcileContext) -> int:
        ca_name, server_name = tls_secret_names(ctx.cluster)
        ctx.wanted.update({("v1", "Secret", ca_name), ("v1", "Secret", server_name)})
        now = self.clock()
        observed_ca = ctx.snapshot.find("v1", "Secret", ca_name)
        if observed_ca is None and ctx.claims.blocked(("v1", "Secret", ca_name)):
            return 0  # someone else's Secret holds the CA's name: nothing can be issued (a conflict)
        brought_ca, user = await self._user_tls(ctx, now)
        if observed_ca is None:
            if self.memo.pending((ctx.namespace, "Secret", ca_name, "create"), None, ""):
                return 0  # created a moment ago; the cache has not shown it yet
            # A new CA answers a rotation asked for already: none starts while it is being stored.
            authority = Authority(
                brought_ca or new_ca(ctx.cluster, now),
                rotated_for=objects.annotation(ctx.body, ROTATE_CA_ANNOTATION) or "",
            )
            replication_ca = new_replication_ca(ctx.cluster, now)
            _, server_name = tls_secret_names(ctx.cluster)
            if ctx.snapshot.find("v1", "Secret", server_name) is None:
                # A new cluster: the leaves need the CA in hand, not stored, so both Secrets go in one
                # round trip (a new cluster's first reconcile is bound by its round trips). Should the CA's
                # name turn out taken, the server Secret is left as created: the next passes issue
                # nothing until the CA is the cluster's.
                return await all_of([
                    self._store_ca(ctx, authority, replication_ca),
                    self._leaves(ctx, observed_ca, authority, replication_ca, brought_ca, user,
                                 now)])  # fmt: skip
            # The CA Secret went (or its name is held by a foreign one): the leaves follow only a CA
            # that could be stored, or each reconcile would re-issue them from a CA of its own.
            stored = await self._store_ca(ctx, authority, replication_ca)
            if ctx.claims.blocked(("v1", "Secret", ca_name)):
                return stored
            leaves = await self._leaves(ctx, observed_ca, authority, replication_ca, brought_ca, user, now)
            return stored + leaves
        self.memo.seen((ctx.namespace, "Secret", ca_name, "create"))
        found = authority_from_secret(observed_ca)
        if found is None:
            ctx.report(
                (
                    "CertificateAuthorityInvalid",
                    f"Secret {ca_name} holds no readable ca.crt and ca.key: no certificate can be issued",
                )
            )
            return 0
        kept = replication_ca_from_secret(observed_ca)
        if kept is None:
            return await self._add_replication_ca(ctx, observed_ca, now)
        return await self._leaves(ctx, observed_ca, found, kept, brought_ca, user, now)

    async def _add_replication_ca(
        self, ctx: ReconcileContext, observed_ca: dict[str, Any], now: dt.datetime
    ) -> int:
        """A Secret <name>-ca written before the replication CA existed gets one; the leaves follow on the
        pass that sees it."""
        ca_name, _ = tls_secret_names(ctx.cluster)
        rv = objects.resource_version(observed_ca)
        ident = (ctx.namespace, "Secret", ca_name, "replication-ca")
        if self.memo.pending(ident, rv, ""):
            return 0
        patch = replication_ca_patch(new_replication_ca(ctx.cluster, now), rv)
        if not await self._patch(ctx, observed_ca, patch):
            return 1
        self.memo.wrote(ident, rv, "")
        log.info("%s/%s: made the cluster's replication CA", ctx.namespace, ctx.name)
        return 1

    async def _store_ca(self, ctx: ReconcileContext, authority: Authority, replication_ca: KeyPair) -> int:
        ca_name, _ = tls_secret_names(ctx.cluster)
        if await self._create(ctx, authority_secret(ctx.cluster, authority, replication_ca)):
            self.memo.wrote((ctx.namespace, "Secret", ca_name, "create"), None, "")
        return 1

    async def _leaves(self, ctx: ReconcileContext, observed_ca: dict[str, Any] | None, authority: Authority,
                      replication_ca: KeyPair, brought_ca: KeyPair | None, user: UserServer | None,
                      now: dt.datetime) -> int:  # fmt: skip
        """The server Secret (issued, renewed, or rotated to a new CA) and the application's CA."""
        _, server_name = tls_secret_names(ctx.cluster)
        observed_server = ctx.snapshot.find("v1", "Secret", server_name)
        trust = trust_bundle(authority.trust_pem(), user)
        step = plan(authority, objects.annotation(ctx.body, ROTATE_CA_ANNOTATION), observed_server,
                    self._loaded(ctx), now, trust_pem=trust, replacement=brought_ca,
                    trust_period=self.ca_trust_period)  # fmt: skip
        if step.start or step.finish:
            return await self._rotate(ctx, observed_ca, authority, step, now, brought_ca)
        if step.waiting:
            log.info("%s/%s: CA rotation waits for %s", ctx.namespace, ctx.name, step.waiting)
        if step.again_in is not None:
            ctx.again_in(step.again_in)
        # Applications keep trusting what the instances may still present until every instance serves
        # what the wanted bundle covers (the server Secret keeps the old CAs until then, and so do they).
        app_trust = trust_while_leaves_change(secret_bytes(observed_server, CA_CERT_KEY), trust)
        return (await self._server(ctx, step.leaf_ca, replication_ca, trust, now, user)
                + await self._app_ca(ctx, app_trust))  # fmt: skip

    async def _user_tls(
        self, ctx: ReconcileContext, now: dt.datetime
    ) -> tuple[KeyPair | None, UserServer | None]:
        """The CA and server certificate the user brings (spec.tls), each None when not asked for or not
        usable; what is wrong is reported (Degraded TlsSecretInvalid, one Warning per message) and the
        operator keeps what runs."""
        wanted = ctx.cluster.spec.tls
        ca: KeyPair | str | None = None
        server: UserServer | str | None = None
        if wanted.ca_secret:
            ca = user_ca(wanted.ca_secret, ctx.snapshot.find("v1", "Secret", wanted.ca_secret))
        if wanted.server_secret:
            server = user_server(ctx.cluster, wanted.server_secret,
                                 ctx.snapshot.find("v1", "Secret", wanted.server_secret), now)  # fmt: skip
        problems = [x for x in (ca, server) if isinstance(x, str)]
        key = (ctx.namespace, ctx.name)
        if problems:
            message = "; ".join(problems)
            ctx.report(("TlsSecretInvalid", message))
            if self._refused.get(key) != message:
                self._refused.set(key, message)
                await self.events.record(ctx.body, "Warning", "TlsSecretInvalid", message)
        else:
            self._refused.drop(key)
        return (ca if isinstance(ca, KeyPair) else None,
                server if isinstance(server, UserServer) else None)  # fmt: skip

    def _behind(self, ctx: ReconcileContext, secret: Mapping[str, Any]) -> str:
        """The running instances that have not loaded exactly this server Secret, comma-separated."""
        wanted = secret_digest(secret)
        return ", ".join(sorted(n for n, seen in self._loaded(ctx).items() if seen != wanted))

    def _loaded(self, ctx: ReconcileContext) -> dict[str, str]:
        """What each running instance says it loaded (tls_files.LOADED_TAG in Patroni's member data);
        pods going away or whose database is not running are left out (a starting one reads the Secret as
        it is then)."""
        found: dict[str, str] = {}
        for pod in ctx.snapshot.of_kind("v1", "Pod"):
            if objects.label(pod, CLUSTER_LABEL) != ctx.name:
                continue
            inst = instance_from_pod(pod)
            if inst.terminating or inst.container_down:
                continue
            found[inst.name] = loaded_tls(objects.meta(pod))
        return found

    async def _rotate(
        self,
        ctx: ReconcileContext,
        observed: Mapping[str, Any] | None,
        authority: Authority,
        step: Plan,
        now: dt.datetime,
        brought_ca: KeyPair | None,
    ) -> int:
        """Start a CA rotation (a new CA beside the current one) or finish it (the old one goes)."""
        name = names.ca_secret(ctx.cluster)
        rv = objects.resource_version(observed)
        what = "start" if step.start else "finish"
        if self.memo.pending((ctx.namespace, "Secret", name, "rotate"), rv, what):
            return 0
        if step.start:
            requested = objects.annotation(ctx.body, ROTATE_CA_ANNOTATION)
            after = start(authority, requested, brought_ca or new_ca(ctx.cluster, now), now)
        else:
            after = finish(authority)
        if not await self._patch(ctx, observed, authority_patch(after, rv)):
            return 1
        self.memo.wrote((ctx.namespace, "Secret", name, "rotate"), rv, what)
        message = (
            f"started a rotation of the certificate authority: every instance and Secret "
            f"{names.app_secret(ctx.cluster)} trust the old and the new CA until the new one has "
            "re-issued every certificate"
            if step.start
            else "finished the rotation of the certificate authority: the old CA is no longer trusted"
        )
        log.info("%s/%s: %s", ctx.namespace, ctx.name, message)
        await self.events.record(ctx.body, "Normal", "CertificateAuthorityRotation", message)
        return 1

    async def _app_ca(self, ctx: ReconcileContext, trust_pem: bytes) -> int:
        """The application Secret carries the CA certificates its clients verify the server with."""
        name = names.app_secret(ctx.cluster)
        app = ctx.snapshot.find("v1", "Secret", name)
        wanted = base64.b64encode(trust_pem).decode("ascii")
        if app is None or objects.deleting(app) or (app.get("data") or {}).get(APP_CA_KEY) == wanted:
            return 0
        rv = objects.resource_version(app)
        if self.memo.pending((ctx.namespace, "Secret", name, "ca"), rv, wanted):
            return 0
        patch = {"metadata": {"resourceVersion": rv}, "data": {APP_CA_KEY: wanted}}
        if not await self._patch(ctx, app, patch):
            return 1
        self.memo.wrote((ctx.namespace, "Secret", name, "ca"), rv, wanted)
        return 1

    async def _server(self, ctx: ReconcileContext, ca: KeyPair, replication_ca: KeyPair, trust_pem: bytes,
                      now: dt.datetime, user: UserServer | None) -> int:  # fmt: skip
        """Secret <name>-server-tls: the server certificate (the operator's, signed by `ca`, or the
        user's), `trust_pem` as ca.crt, and the replication role's certificate with the CAs client
        certificates are accepted from (the replication CA's: `replication_trust`)."""
        name = names.server_tls_secret(ctx.cluster)
        observed = ctx.snapshot.find("v1", "Secret", name)
        # Addresses load balancers gave the additional Services (the cluster's own, from the snapshot).
        own = [svc for svc in ctx.snapshot.of_kind("v1", "Service") if controlled_by(svc, ctx.cluster.uid)]
        assigned = assigned_addresses(ctx.cluster, own)
        if user is None:
            why = server_renewal(ctx.cluster, ca, observed, now, trust_pem, assigned)
        else:
            why = user_server_renewal(user, trust_pem, observed)
        everyone_loaded = observed is not None and not self._behind(ctx, observed)
        replication = replication_trust(replication_ca, observed, now, everyone_loaded=everyone_loaded)
        ident = (ctx.namespace, "Secret", name, "issue")
        if why is None and observed is not None and replication.why is not None:
            return await self._replication(ctx, observed, replication_ca, replication, now)
        if why is None:
            # The cache shows what was issued: forget the write, or the Secret deleted soon after would
            # look like our issue not yet seen, and stay missing until the memo expires and a resync comes.
            self.memo.seen(ident)
            return 0
        rv = objects.resource_version(observed)
        if self.memo.pending(ident, rv, why):
            return 0
        served = (issue_server(ctx.cluster, ca, now, assigned) if user is None
                  else KeyPair(user.cert_pem, user.key_pem))  # fmt: skip
        observed_trust = secret_bytes(observed, CA_CERT_KEY)
        if (
            why == TRUST_CHANGED
            and observed is not None
            and any(c not in pem_certificates(trust_pem) for c in pem_certificates(observed_trust))
        ):
            # A CA leaves the bundle only once every instance serves leaves it did not sign.
            behind = self._behind(ctx, observed)
            if behind:
                log.info(
                    "%s/%s: a CA leaves the bundle once %s loaded the new certificates",
                    ctx.namespace,
                    ctx.name,
                    behind,
                )
                return 0
        elif why != TRUST_CHANGED and observed is not None:
            trust_pem = trust_while_leaves_change(observed_trust, trust_pem)
        # The replication certificate in use is kept unless replication_trust moves it on.
        cert, key = secret_bytes(observed, REPLICATION_CERT_KEY), secret_bytes(observed, REPLICATION_KEY_KEY)
        client = (KeyPair(cert, key) if cert and key and not replication.reissue
                  else issue_client(replication_ca, REPLICATION_USER, now))  # fmt: skip
        desired = server_secret(ctx.cluster, ca, served, client, trust_pem, replication.bundle)
        if user is not None and observed is not None and why == USER_CERTIFICATE_CHANGED:
            # Peers must trust the new certificate's CA before any instance presents it: first the
            # bundle alone, then, once every instance loaded it, the certificate.
            if any(c not in pem_certificates(observed_trust) for c in pem_certificates(trust_pem)):
                desired = {"data": {CA_CERT_KEY: b64(trust_pem)}}
                why = "trusting the CA of the user's server certificate before presenting it"
            else:
                behind = self._behind(ctx, observed)
                if behind:
                    log.info(
                        "%s/%s: the user's server certificate waits for %s to load its CA",
                        ctx.namespace,
                        ctx.name,
                        behind,
                    )
                    return 0
        return await self._write_server(ctx, observed, desired, why)

    async def _write_server(
        self, ctx: ReconcileContext, observed: Mapping[str, Any] | None, desired: dict[str, Any], why: str
    ) -> int:
        """Create or patch Secret <name>-server-tls (pinned to the version read) and say why."""
        name = names.server_tls_secret(ctx.cluster)
        ident = (ctx.namespace, "Secret", name, "issue")
        rv = objects.resource_version(observed)
        if observed is None:
            if not await self._create(ctx, desired):
                return 1
        else:
            patch = {"metadata": {"resourceVersion": rv}, "data": desired["data"]}
            if not await self._patch(ctx, observed, patch):
                return 1
        self.memo.wrote(ident, rv, why)
        log.info("%s/%s: issued the server certificate (%s)", ctx.namespace, ctx.name, why)
        if observed is not None:  # a new cluster's first certificate is no news
            await self.events.record(ctx.body, "Normal", "CertificateIssued",
                                     f"issued a new server certificate in Secret {name}: {why}")  # fmt: skip
        return 1

    async def _replication(self, ctx: ReconcileContext, observed: Mapping[str, Any], replication_ca: KeyPair,
                           step: ReplicationTrust, now: dt.datetime) -> int:  # fmt: skip
        """Only the replication part of Secret <name>-server-tls changes: its trusted CAs, and with them or
        after them the client certificate (`replication_trust` orders the steps)."""
        name = names.server_tls_secret(ctx.cluster)
        rv = objects.resource_version(observed)
        ident = (ctx.namespace, "Secret", name, "replication")
        if self.memo.pending(ident, rv, step.why or ""):
            return 0
        data = {REPLICATION_CA_KEY: b64(step.bundle)}
        if step.reissue:
            client = issue_client(replication_ca, REPLICATION_USER, now)
            data |= {REPLICATION_CERT_KEY: b64(client.cert_pem), REPLICATION_KEY_KEY: b64(client.key_pem)}
        if not await self._patch(ctx, observed, {"metadata": {"resourceVersion": rv}, "data": data}):
            return 1
        self.memo.wrote(ident, rv, step.why or "")
        log.info("%s/%s: replication certificate: %s", ctx.namespace, ctx.name, step.why)
        return 1

    async def _patch(
        self, ctx: ReconcileContext, observed: Mapping[str, Any] | None, patch: dict[str, Any]
    ) -> bool:
        """A merge patch of one of the cluster's Secrets, conditional on the version read; False when the
        Secret went, was replaced or changed meanwhile (the next reconcile decides again)."""
        try:
            return await patch_owned(self.api, ctx.claims, Secret, observed, patch)
        except ApiError as exc:
            if is_conflict(exc):
                return False
            raise

    async def _create(self, ctx: ReconcileContext, secret: dict[str, object]) -> bool:
        """Create-only: False when something holds the name already (the cluster's own, the cache had
        not caught up; or a foreign one, a conflict in the claims)."""
        made, _ = await create_owned(self.api, ctx.claims, secret)
        return made is Made.CREATED
