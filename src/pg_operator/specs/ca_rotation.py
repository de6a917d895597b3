"""Rotating a cluster's certificate authority without a failed connection. Pure: the caller passes the
time, the Secrets as the cache holds them and what each instance reports it has loaded.

A new CA cannot simply replace the old one: the kubelet delivers a changed Secret to each pod at its own
moment (up to a minute or more apart), and a replica that still trusts only the old CA would refuse a
primary that already presents a certificate from the new one. So a rotation goes through a bundle:

1. **trust**: a new CA is made; the old one stays as `previous-ca.*` in Secret `<name>-ca`, and every
   instance (and the app Secret's `ca.crt`) is given both CA certificates while the leaves stay the old
   CA's;
2. **re-issue**: once every running instance has loaded the bundle and the trust period has passed
   (applications that read the app Secret's `ca.crt` from a mounted volume get it within that), the
   leaves are re-issued by the new CA;
3. **finish**: once every running instance serves the new leaves, the old CA is dropped from the bundle.

A rotation starts when the cluster's `db.example.com/rotate-ca` annotation takes a value it has not had
(the CA Secret remembers the last one acted on), by itself when the CA has a third of its life left, or,
with a CA the user brings (`spec.tls.caSecret`), when that Secret holds another CA: then the new CA is the
user's, and the annotation and the CA's age are the user's business.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs import tls
from pg_operator.tls_files import TLS_FILES, digest

# On the PostgresCluster: a new value asks for a rotation (`kubectl annotate pgc NAME
# db.example.com/rotate-ca="$(date +%s)" --overwrite`).
ROTATE_CA_ANNOTATION = "db.example.com/rotate-ca"
# On Secret <name>-ca: when the running rotation began, and the request value last acted on.
STARTED_ANNOTATION = "db.example.com/ca-rotation-started"
ROTATED_FOR_ANNOTATION = "db.example.com/ca-rotated-for"
PREVIOUS_CERT_KEY, PREVIOUS_KEY_KEY = "previous-ca.crt", "previous-ca.key"
TRUST_PERIOD = dt.timedelta(seconds=90)  # the default; `pg-operator run --ca-trust-period`


@dataclass(frozen=True)
class Authority:
    """The CA that signs new leaves, and during a rotation the one it replaces."""

    current: tls.KeyPair
    previous: tls.KeyPair | None = None
    started: dt.datetime | None = None
    rotated_for: str = ""

    def trust_pem(self) -> bytes:
        """What instances and clients trust: the current CA, and the previous one while it may still sign
        a leaf in use."""
        return self.current.cert_pem + (self.previous.cert_pem if self.previous else b"")


def _pair(secret: Mapping[str, Any] | None, cert_key: str, key_key: str) -> tls.KeyPair | None:
    return tls.ca_from_secret(
        {
            "data": {
                tls.CA_CERT_KEY: ((secret or {}).get("data") or {}).get(cert_key),
                tls.CA_KEY_KEY: ((secret or {}).get("data") or {}).get(key_key),
            }
        }
    )


def authority_from_secret(secret: Mapping[str, Any] | None) -> Authority | None:
    current = tls.ca_from_secret(secret)
    if current is None:
        return None
    started = None
    raw = objects.annotation(secret or {}, STARTED_ANNOTATION)
    if raw:
        try:
            started = dt.datetime.fromisoformat(raw)
        except ValueError:
            started = None
    return Authority(current, _pair(secret, PREVIOUS_CERT_KEY, PREVIOUS_KEY_KEY), started,
                     objects.annotation(secret or {}, ROTATED_FOR_ANNOTATION) or "")  # fmt: skip


def replication_ca_from_secret(secret: Mapping[str, Any] | None) -> tls.KeyPair | None:
    """The cluster's replication CA, kept beside the authority in Secret <name>-ca (no rotation moves it)."""
    return _pair(secret, tls.REPLICATION_CA_KEY, tls.REPLICATION_CA_KEY_KEY)


def replication_ca_patch(replication_ca: tls.KeyPair, resource_version: str | None) -> dict[str, Any]:
    """A merge patch adding the replication CA to a Secret <name>-ca written before it existed."""
    return {"metadata": {"resourceVersion": resource_version},
            "data": {tls.REPLICATION_CA_KEY: tls.b64(replication_ca.cert_pem),
                     tls.REPLICATION_CA_KEY_KEY: tls.b64(replication_ca.key_pem)}}  # fmt: skip


def authority_secret(cluster: PostgresCluster, authority: Authority,
                     replication_ca: tls.KeyPair | None = None) -> dict[str, Any]:  # fmt: skip
    """Secret <name>-ca for this authority and the replication CA (a finished rotation removes the
    previous keys with `null` in a merge patch: see `authority_patch`)."""
    body = tls.ca_secret(cluster, authority.current)
    if replication_ca is not None:
        body["data"].update(replication_ca_patch(replication_ca, None)["data"])
    if authority.previous is not None:
        body["data"][PREVIOUS_CERT_KEY] = tls.b64(authority.previous.cert_pem)
        body["data"][PREVIOUS_KEY_KEY] = tls.b64(authority.previous.key_pem)
    annotations = {ROTATED_FOR_ANNOTATION: authority.rotated_for} if authority.rotated_for else {}
    if authority.started is not None:
        annotations[STARTED_ANNOTATION] = authority.started.isoformat()
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def authority_patch(authority: Authority, resource_version: str | None) -> dict[str, Any]:
    """A merge patch making Secret <name>-ca hold exactly this authority (conditional on the version)."""
    data: dict[str, Any] = {tls.CA_CERT_KEY: tls.b64(authority.current.cert_pem),
                            tls.CA_KEY_KEY: tls.b64(authority.current.key_pem),
                            PREVIOUS_CERT_KEY: None, PREVIOUS_KEY_KEY: None}  # fmt: skip
    if authority.previous is not None:
        data[PREVIOUS_CERT_KEY] = tls.b64(authority.previous.cert_pem)
        data[PREVIOUS_KEY_KEY] = tls.b64(authority.previous.key_pem)
    return {"metadata": {"resourceVersion": resource_version, "annotations": {
        STARTED_ANNOTATION: authority.started.isoformat() if authority.started else None,
        ROTATED_FOR_ANNOTATION: authority.rotated_for or None}}, "data": data}  # fmt: skip


def secret_digest(server_secret: Mapping[str, Any] | None) -> str:
    """The digest an instance publishes once it loaded exactly this Secret's files."""
    return digest(tls.secret_bytes(server_secret, name) for name in TLS_FILES)


@dataclass(frozen=True)
class Plan:
    leaf_ca: tls.KeyPair  # signs the leaves now
    start: bool = False  # begin a rotation: a new CA beside the current one
    finish: bool = False  # the previous CA may go
    waiting: str = ""  # what a running rotation waits for
    again_in: float | None = None  # seconds until the trust period is over (no event announces it)


def _leaves_by(secret: Mapping[str, Any] | None, ca: tls.KeyPair, previous: tls.KeyPair) -> bool:
    """No leaf in the Secret is the previous CA's any more. The authority signs only the server
    certificate (the replication role's is the replication CA's); a server certificate the user brings is
    neither CA's, and then the authority signs nothing the instances present."""
    pem = tls.secret_bytes(secret, tls.TLS_CERT_KEY)
    try:
        cert = x509.load_pem_x509_certificate(pem) if pem else None
    except ValueError:
        return False
    if cert is None:
        return False
    return tls.issued_by(cert, ca) or not tls.issued_by(cert, previous)


def plan(
    authority: Authority,
    requested: str | None,
    server_secret: Mapping[str, Any] | None,
    loaded: Mapping[str, str],
    now: dt.datetime,
    *,
    trust_pem: bytes | None = None,
    replacement: tls.KeyPair | None = None,
    trust_period: dt.timedelta = TRUST_PERIOD,
) -> Plan:
    """`trust_pem`: what the instances must trust now (default: the authority's bundle; more when the
    user brings the server certificate); `replacement`: the CA the user brings, rolled in when it differs;
    `trust_period`: how long both CAs are trusted before the new one's leaves are served."""
    current = authority.current
    trust = trust_pem if trust_pem is not None else authority.trust_pem()
    if authority.previous is None:
        end = x509.load_pem_x509_certificate(current.cert_pem).not_valid_after_utc
        replaced = replacement is not None and replacement.cert_pem != current.cert_pem
        asked = bool(requested and requested != authority.rotated_for) and replacement is None
        if replaced or asked or (replacement is None and now >= end - tls.CA_LIFETIME / 3):
            return Plan(leaf_ca=current, start=True)
        return Plan(leaf_ca=current)
    wanted = secret_digest(server_secret)
    behind = sorted(name for name, seen in loaded.items() if seen != wanted)
    bundled = tls.secret_bytes(server_secret, tls.CA_CERT_KEY) == trust
    if _leaves_by(server_secret, current, authority.previous):
        if bundled and not behind:
            return Plan(leaf_ca=current, finish=True)
        return Plan(leaf_ca=current, waiting=f"instances loading the new CA's leaves: {', '.join(behind)}")
    remaining = (authority.started + trust_period - now).total_seconds() if authority.started else 0.0
    if bundled and not behind and remaining <= 0:
        return Plan(leaf_ca=current)  # every instance trusts both: the new CA's leaves may come
    waits = [f"instances loading both CAs: {', '.join(behind)}"] if behind or not bundled else []
    if remaining > 0:
        waits.append(f"the trust period ({remaining:.0f} s left)")
    return Plan(
        leaf_ca=authority.previous,
        waiting="; ".join(waits) or "the bundle",
        again_in=max(remaining, 1.0) if remaining > 0 else None,
    )


def start(authority: Authority, requested: str | None, new: tls.KeyPair, now: dt.datetime) -> Authority:
    return Authority(new, authority.current, now, requested or authority.rotated_for)


def finish(authority: Authority) -> Authority:
    return Authority(authority.current, None, None, authority.rotated_for)
