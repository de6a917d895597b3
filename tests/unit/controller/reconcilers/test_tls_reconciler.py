"""The TLS sub-reconciler on stand-ins (no cluster): a new cluster gets its CA and a server certificate it
signed in one pass, and a pass over what was issued writes nothing; a CA Secret that cannot be read stops
every issue and says so; a certificate near its end is reported with one Warning."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from typing import Any

from cryptography import x509
from reconciler_fakes import FakeApi, RecordedEvents, context, owned

from pg_operator.controller.reconcilers.tls import TlsReconciler
from pg_operator.controller.writes import WriteMemo

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def reconciler(api: FakeApi, events: RecordedEvents, now: dt.datetime = NOW) -> TlsReconciler:
    return TlsReconciler(api, WriteMemo(), events, clock=lambda: now)  # type: ignore[arg-type]


def as_cached(created: dict[str, Any]) -> dict[str, Any]:
    meta = created["metadata"]
    return owned(
        "Secret", meta["name"], data=created["data"], metadata={"annotations": meta.get("annotations") or {}}
    )


def certificate(secret: dict[str, Any], key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


def test_a_new_cluster_gets_a_ca_and_a_server_certificate_it_signed_then_nothing_more() -> None:
    api, events = FakeApi(), RecordedEvents()
    tls = reconciler(api, events)
    assert asyncio.run(tls.create(context())) == 2
    by_name = {s["metadata"]["name"]: s for s in api.created}
    assert sorted(by_name) == ["orders-db-ca", "orders-db-server-tls"]
    ca, served = certificate(by_name["orders-db-ca"], "ca.crt"), certificate(by_name["orders-db-server-tls"])
    assert served.issuer == ca.subject
    served.verify_directly_issued_by(ca)
    dns = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "orders-db-rw.shop.svc" in dns.get_values_for_type(x509.DNSName)

    again = FakeApi()
    tls.api = again  # type: ignore[assignment]
    assert asyncio.run(tls.create(context([as_cached(s) for s in api.created]))) == 0
    assert again.created == [] and again.patched == []
    assert events.posted == []  # a new cluster's first certificate is no news


def test_an_unreadable_ca_secret_stops_every_issue_and_says_why() -> None:
    api, events = FakeApi(), RecordedEvents()
    ctx = context([owned("Secret", "orders-db-ca", data={"ca.crt": base64.b64encode(b"not a pem").decode()})])
    assert asyncio.run(reconciler(api, events).create(ctx)) == 0
    assert ctx.problem is not None and ctx.problem[0] == "CertificateAuthorityInvalid"
    assert api.created == [] and api.patched == []


def test_a_certificate_near_its_end_is_reported_with_one_warning() -> None:
    api, events = FakeApi(), RecordedEvents()
    issuing = reconciler(api, events)
    asyncio.run(issuing.create(context()))
    cached = [as_cached(s) for s in api.created]
    late = certificate(next(s for s in api.created if s["metadata"]["name"] == "orders-db-server-tls"))
    near_end = late.not_valid_after_utc - dt.timedelta(days=3)
    tls = reconciler(FakeApi(), events, now=near_end)
    for _ in range(2):
        ctx = context(cached)
        asyncio.run(tls.follow_up(ctx))
        assert ctx.problem is not None and ctx.problem[0] == "CertificateExpiring"
    assert events.reasons() == ["CertificateExpiring"]
