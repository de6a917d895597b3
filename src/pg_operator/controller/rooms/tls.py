"""The TLS room: the cluster's certificate authority and the instances' server certificate, issued and
renewed by the operator (specs/tls.py). The CA is created once; the server certificate is re-issued
when a third of its life is left, when the names it must carry change, or when the CA changed. The
instances reload a renewed certificate without a restart (instance/main.py)."""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator import objects
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
    issue_server,
    new_ca,
    server_renewal,
    server_secret,
    tls_secret_names,
)

log = logging.getLogger(__name__)


class TlsRoom(Room):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:  # fmt: skip
        self.api = api
        self.memo = memo
        self.events = events
        self.clock = clock

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
        desired = server_secret(p.cluster, ca, issue_server(p.cluster, ca, now))
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
