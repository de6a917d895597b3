"""The TLS room: the cluster's certificate authority and the instances' server certificate, issued and
renewed by the operator (specs/tls.py). The CA is created once; the server certificate is re-issued
when a third of its life is left, when the names it must carry change, or when the CA changed. The
instances reload a renewed certificate without a restart (instance/main.py). The room also reports when
each certificate in use expires (a gauge per certificate) and, as Degraded `CertificateExpiring` with a
Warning Event, one that comes within three weeks of its end without having been renewed."""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret
from prometheus_client import CollectorRegistry, Gauge

from pg_operator import objects
from pg_operator.api.constants import REPLICATION_USER
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, is_conflict, is_not_found
from pg_operator.controller.rooms import ClusterPass, Room
from pg_operator.controller.writes import WriteMemo
from pg_operator.specs import names
from pg_operator.specs.secrets import APP_CA_KEY
from pg_operator.specs.tls import (
    KeyPair,
    ca_from_secret,
    ca_secret,
    certificates_in_use,
    expiring,
    issue_client,
    issue_server,
    new_ca,
    server_renewal,
    server_secret,
    tls_secret_names,
)

log = logging.getLogger(__name__)


class CertificateMetrics:
    """`pg_operator_certificate_expiry_timestamp_seconds`: when each certificate a cluster uses ends (Unix
    time), so an alert can fire well before; a cluster's series go with it."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.expiry = Gauge(
            "pg_operator_certificate_expiry_timestamp_seconds",
            "When a cluster's certificate expires (Unix time), by role: ca, server, replication.",
            ["namespace", "cluster", "certificate", "secret"],
            registry=registry,
        )
        self._series: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def set(self, key: tuple[str, str], ends: dict[str, tuple[str, dt.datetime]]) -> None:
        """`ends`: role → (Secret, expiry); empty when the cluster is gone."""
        series = {(role, secret) for role, (secret, _) in ends.items()}
        for role, secret in self._series.pop(key, set()) - series:
            self.expiry.remove(key[0], key[1], role, secret)
        for role, (secret, end) in ends.items():
            self.expiry.labels(namespace=key[0], cluster=key[1], certificate=role, secret=secret).set(
                end.timestamp())
        if series:
            self._series[key] = series


class TlsRoom(Room):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 registry: CollectorRegistry | None = None) -> None:  # fmt: skip
        self.api = api
        self.memo = memo
        self.events = events
        self.clock = clock
        self.metrics = CertificateMetrics(registry)
        self._warned: dict[tuple[str, str], str] = {}  # the CertificateExpiring message last posted

    def forget(self, key: tuple[str, str]) -> None:
        self.metrics.set(key, {})
        self._warned.pop(key, None)

    async def settle(self, p: ClusterPass) -> int:
        """Report what the cache shows in use: the expiry gauge, and a certificate near its end that was
        not renewed as a problem with one Warning per distinct message."""
        ca_name, server_name = tls_secret_names(p.cluster)
        in_use = certificates_in_use(p.snapshot.find("v1", "Secret", ca_name),
                                     p.snapshot.find("v1", "Secret", server_name))  # fmt: skip
        self.metrics.set((p.namespace, p.name), {role: (ca_name if role == "ca" else server_name, end)
                                                 for role, end in in_use.items()})  # fmt: skip
        message = expiring(in_use, self.clock())
        key = (p.namespace, p.name)
        if message is None:
            self._warned.pop(key, None)
            return 0
        p.report(("CertificateExpiring", message))
        if self._warned.get(key) == message:
            return 0
        self._warned[key] = message
        return int(await self.events.record(p.body, "Warning", "CertificateExpiring", message))

    async def create(self, p: ClusterPass) -> int:
        ca_name, server_name = tls_secret_names(p.cluster)
        p.wanted.update({("v1", "Secret", ca_name), ("v1", "Secret", server_name)})
        now = self.clock()
        observed_ca = p.snapshot.find("v1", "Secret", ca_name)
        writes = 0
        if observed_ca is None:
            if self.memo.pending((p.namespace, "Secret", ca_name, "create"), None, ""):
                return 0  # created a moment ago; the cache has not shown it yet
            ca = new_ca(p.cluster, now)
            if not await self._create(ca_secret(p.cluster, ca)):
                return 1
            self.memo.wrote((p.namespace, "Secret", ca_name, "create"), None, "")
            writes += 1
        else:
            self.memo.seen((p.namespace, "Secret", ca_name, "create"))
            found = ca_from_secret(observed_ca)
            if found is None:
                p.report(("CertificateAuthorityInvalid", f"Secret {ca_name} holds no readable ca.crt and "
                          "ca.key: no certificate can be issued"))
                return 0
            ca = found
        return writes + await self._server(p, ca, now) + await self._app_ca(p, ca)

    async def _app_ca(self, p: ClusterPass, ca: KeyPair) -> int:
        """The application Secret carries the CA its clients verify the server with."""
        name = names.app_secret(p.cluster)
        app = p.snapshot.find("v1", "Secret", name)
        wanted = base64.b64encode(ca.cert_pem).decode("ascii")
        if app is None or objects.deleting(app) or (app.get("data") or {}).get(APP_CA_KEY) == wanted:
            return 0
        rv = objects.resource_version(app)
        if self.memo.pending((p.namespace, "Secret", name, "ca"), rv, wanted):
            return 0
        patch = {"metadata": {"resourceVersion": rv}, "data": {APP_CA_KEY: wanted}}
        try:
            await self.api.merge_patch(Secret, name, p.namespace, patch)
        except ApiError as exc:
            if is_conflict(exc) or is_not_found(exc):
                return 1
            raise
        self.memo.wrote((p.namespace, "Secret", name, "ca"), rv, wanted)
        return 1

    async def _server(self, p: ClusterPass, ca: KeyPair, now: dt.datetime) -> int:
        name = names.server_tls_secret(p.cluster)
        observed = p.snapshot.find("v1", "Secret", name)
        why = server_renewal(p.cluster, ca, observed, now)
        ident = (p.namespace, "Secret", name, "issue")
        if why is None:
            # The cache shows what was issued: forget the write, or the Secret deleted soon after would
            # look like our issue not yet seen, and stay missing until the memo expires and a resync comes.
            self.memo.seen(ident)
            return 0
        rv = objects.resource_version(observed)
        if self.memo.pending(ident, rv, why):
            return 0
        desired = server_secret(p.cluster, ca, issue_server(p.cluster, ca, now),
                                issue_client(ca, REPLICATION_USER, now))
        if observed is None:
            if not await self._create(desired):
                return 1
        else:
            patch = {"metadata": {"resourceVersion": rv}, "data": desired["data"]}
            try:
                await self.api.merge_patch(Secret, name, p.namespace, patch)
            except ApiError as exc:
                if is_conflict(exc) or is_not_found(exc):
                    return 1  # changed meanwhile: the next pass decides again
                raise
        self.memo.wrote(ident, rv, why)
        log.info("%s/%s: issued the server certificate (%s)", p.namespace, p.name, why)
        if observed is not None:  # a new cluster's first certificate is no news
            await self.events.record(p.body, "Normal", "CertificateIssued",
                                     f"issued a new server certificate in Secret {name}: {why}")  # fmt: skip
        return 1

    async def _create(self, secret: dict[str, object]) -> bool:
        """Create-only: False when it was there already (the cache had not caught up)."""
        try:
            await self.api.create_dict(secret)
        except ApiError as exc:
            if is_conflict(exc):
                return False
            raise
        return True
