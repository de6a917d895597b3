"""Certificates the user brings (`spec.tls`), checked before they are used. Pure.

A CA (`caSecret`): the operator issues the cluster's leaves with it instead of its own; it must be a CA
whose key matches. A server certificate (`serverSecret`, what a certificate manager writes): the instances
present it instead of the operator's; it must carry every name peers and clients use (the operator's own
certificate's names: the Services in all forms and every pod under the headless Service), its key must
match, and its `ca.crt` must hold its issuer. Whatever is wrong is said with the Secret and the key, and
the operator keeps what runs until it is right. The replication role's client certificate is always the
operator's (issued by the cluster's CA), so replication never depends on the user's chain.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs import tls

USER_CERTIFICATE_CHANGED = "the user's server certificate changed"


@dataclass(frozen=True)
class UserServer:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes  # the chain's CA certificates, as the Secret's ca.crt holds them

    def __repr__(self) -> str:  # the key never appears in a repr
        return "UserServer(<certificate>, <key>, <ca>)"


def _public_bytes(key: Any) -> bytes:
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    encoded: bytes = key.public_bytes(der, spki)
    return encoded


def _matching_key(cert: x509.Certificate, key_pem: bytes) -> PrivateKeyTypes | None:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if _public_bytes(key.public_key()) == _public_bytes(cert.public_key()) else None


def user_ca(name: str, secret: Mapping[str, Any] | None) -> tls.KeyPair | str:
    """The CA in Secret `name` (ca.crt + ca.key, else tls.crt + tls.key), or why it cannot be used."""
    if secret is None:
        return (f"Secret {name} (spec.tls.caSecret) is not there, or lacks the label "
                "db.example.com/cluster=<cluster> that lets the operator see it")  # fmt: skip
    for cert_key, key_key in ((tls.CA_CERT_KEY, tls.CA_KEY_KEY), (tls.TLS_CERT_KEY, tls.TLS_KEY_KEY)):
        cert_pem, key_pem = tls.secret_bytes(secret, cert_key), tls.secret_bytes(secret, key_key)
        if cert_pem and key_pem:
            break
    else:
        return f"Secret {name} (spec.tls.caSecret) holds neither ca.crt and ca.key nor tls.crt and tls.key"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return f"Secret {name} key {cert_key}: not a PEM certificate"
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        return f"Secret {name} key {cert_key}: the certificate is not a CA (basicConstraints CA:TRUE)"
    key = _matching_key(cert, key_pem)
    if key is None:
        return f"Secret {name} key {key_key}: not the private key of {cert_key} (or encrypted)"
    # Leaves are signed with the key as PKCS#8 PEM, whatever form the Secret holds it in.
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())  # fmt: skip
    # Only the CA certificate itself: a chain after it would be trusted as a CA too.
    return tls.KeyPair((tls.pem_certificates(cert_pem) or [cert_pem])[0], pkcs8)


def user_server(
    cluster: PostgresCluster, name: str, secret: Mapping[str, Any] | None, now: dt.datetime
) -> UserServer | str:
    """The server certificate in Secret `name`, or why it cannot be used."""
    if secret is None:
        return (f"Secret {name} (spec.tls.serverSecret) is not there, or lacks the label "
                "db.example.com/cluster=<cluster> that lets the operator see it")  # fmt: skip
    pems = {k: tls.secret_bytes(secret, k) for k in (tls.TLS_CERT_KEY, tls.TLS_KEY_KEY, tls.CA_CERT_KEY)}
    missing = [k for k, v in pems.items() if not v]
    if missing:
        return f"Secret {name} (spec.tls.serverSecret) lacks {', '.join(missing)}"
    cert_pem, key_pem, ca_pem = (pems[k] or b"" for k in (tls.TLS_CERT_KEY, tls.TLS_KEY_KEY, tls.CA_CERT_KEY))
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        authorities = [x509.load_pem_x509_certificate(pem) for pem in tls.pem_certificates(ca_pem)]
    except ValueError:
        return f"Secret {name}: tls.crt or ca.crt is not PEM"
    if _matching_key(cert, key_pem) is None:
        return f"Secret {name} key tls.key: not the private key of tls.crt (or encrypted)"
    if now >= cert.not_valid_after_utc:
        return f"Secret {name} key tls.crt: expired at {cert.not_valid_after_utc.isoformat()}"
    if not any(_signed_by(cert, ca) for ca in authorities):
        return f"Secret {name} key ca.crt: holds no certificate that issued tls.crt"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = set(sans.get_values_for_type(x509.DNSName))
        names |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    except x509.ExtensionNotFound:
        names = set()
    # Loopback too: Patroni asks its own PostgreSQL over TLS, verifying it, when an old primary rejoins.
    wanted = [*tls.server_dns_names(cluster), *tls.server_ip_addresses(cluster)]
    absent = [n for n in wanted if n not in names]
    if absent:
        shown = ", ".join(absent[:6]) + (f" and {len(absent) - 6} more" if len(absent) > 6 else "")
        return f"Secret {name} key tls.crt: does not name {shown} (peers and clients use these names)"
    # Only the leaf in tls.crt: an intermediate, if any, belongs in ca.crt.
    return UserServer((tls.pem_certificates(cert_pem) or [cert_pem])[0], key_pem, ca_pem)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def trust_bundle(authority_trust: bytes, user: UserServer | None) -> bytes:
    """What instances, the operator and applications trust: the user's server CA first (it issued what
    clients are shown), then the cluster's CA(s) (they issued the replication role's certificate)."""
    if user is None:
        return authority_trust
    ca = user.ca_pem if user.ca_pem.endswith(b"\n") else user.ca_pem + b"\n"
    return ca + authority_trust if authority_trust not in ca else ca


def user_server_renewal(user: UserServer, trust_pem: bytes, secret: Mapping[str, Any] | None) -> str | None:
    """Why Secret <name>-server-tls must be rewritten to carry the user's server certificate, or None (the
    replication role's certificate is the replication CA's: `tls.replication_trust`)."""
    if (
        tls.secret_bytes(secret, tls.TLS_CERT_KEY) != user.cert_pem
        or tls.secret_bytes(secret, tls.TLS_KEY_KEY) != user.key_pem
    ):
        return USER_CERTIFICATE_CHANGED
    if tls.secret_bytes(secret, tls.CA_CERT_KEY) != trust_pem:
        return tls.TRUST_CHANGED
    return None
