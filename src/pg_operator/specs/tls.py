"""TLS for a cluster: its own certificate authority and the server certificate every instance presents.

The operator is the CA: Secret `<name>-ca` holds its certificate and key (the key never leaves the
operator and that Secret; no pod mounts it). Secret `<name>-server-tls` (type kubernetes.io/tls) holds the
instances' server certificate, its key and the CA certificate, and is mounted in every pod. The server
certificate names every way a client reaches an instance: each Service (`<name>`, `-rw`, `-ro`, `-r`, the
pooler's and the additional ones of spec.services) in its short, `.<ns>`, `.<ns>.svc` and
`.svc.cluster.local` forms, every pod through the headless Service (wildcards), loopback, and the host
names and addresses spec.services.additional[].hosts declares. The same Secret holds the replication
role's client certificate (CN = `replicator`), with which the instances authenticate to each other.
ECDSA P-256 keys; a leaf is renewed once a third of its life is left, and re-issued at once when the
names or addresses it must carry or its CA changed.
Pure: the caller passes the time.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import REPLICATION_USER
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_CREDENTIALS, child_metadata

CA_LIFETIME = dt.timedelta(days=3650)
TRUST_CHANGED = "the trusted certificate authorities changed"  # only ca.crt differs
LEAF_LIFETIME = dt.timedelta(days=90)
# Backdated, so a node whose clock runs a little behind accepts a certificate issued a moment ago.
CLOCK_SKEW = dt.timedelta(minutes=5)
CLUSTER_DOMAIN = "cluster.local"

CA_CERT_KEY, CA_KEY_KEY = "ca.crt", "ca.key"
TLS_CERT_KEY, TLS_KEY_KEY = "tls.crt", "tls.key"
# The replication role's client certificate (CN = the role), beside the server's in the same Secret: the
# instances authenticate replication and pg_rewind with it instead of a password.
REPLICATION_CERT_KEY, REPLICATION_KEY_KEY = "replication.crt", "replication.key"
# The only CA whose client certificates the instances accept (PostgreSQL's ssl_ca_file), beside them in
# the same Secret. It is the cluster's replication CA, which the operator makes and keeps in Secret
# `<name>-ca` under the same key names as a pair: never a CA the user brings (`spec.tls`), whose issuer
# may sign `CN=replicator` for anyone else it serves, so the replication identity is this cluster's alone.
REPLICATION_CA_KEY, REPLICATION_CA_KEY_KEY = "replication-ca.crt", "replication-ca.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # the key never appears in a repr
        return "KeyPair(<certificate>, <key>)"


def tls_secret_names(cluster: PostgresCluster) -> list[str]:
    """The Secrets the TLS sub-reconciler owns (the credentials' are `specs.secret_names`)."""
    return [names.ca_secret(cluster), names.server_tls_secret(cluster)]


def server_dns_names(
    cluster: PostgresCluster, domain: str = CLUSTER_DOMAIN, assigned: Sequence[str] = ()
) -> list[str]:
    """`assigned`: the addresses and host names load balancers gave the additional Services
    (specs.services.assigned_addresses); their host names are named too."""
    ns = cluster.namespace
    out: list[str] = []
    # The pooler's Services too, whether it is on or not (turning it on then costs no new certificate):
    # its pods serve clients with this certificate (docs/pooler.md).
    services = (names.headless_service(cluster), names.rw_service(cluster), names.ro_service(cluster),
                names.r_service(cluster), f"{cluster.name}-pooler-rw",
                f"{cluster.name}-pooler-ro")  # fmt: skip
    for svc in services:
        out += [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.{domain}"]
    headless = names.headless_service(cluster)
    out += [f"*.{headless}.{ns}.svc", f"*.{headless}.{ns}.svc.{domain}", "localhost"]
    # The additional Services (spec.services.additional) and the host names clients dial to reach them.
    for extra in cluster.spec.services.additional:
        out += [extra.name, f"{extra.name}.{ns}", f"{extra.name}.{ns}.svc", f"{extra.name}.{ns}.svc.{domain}"]
    hosts = [h for extra in cluster.spec.services.additional for h in extra.hosts if not _is_ip(h)]
    hosts += [h for h in assigned if not _is_ip(h)]
    out += [h for h in dict.fromkeys(hosts) if h not in out]
    return out


SERVER_IPS = ("127.0.0.1", "::1")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def server_ip_addresses(cluster: PostgresCluster, assigned: Sequence[str] = ()) -> list[str]:
    """Loopback, the addresses declared in spec.services.additional[].hosts and those load balancers
    assigned (`assigned`), normalised."""
    declared = [h for extra in cluster.spec.services.additional for h in extra.hosts]
    return list(dict.fromkeys([*SERVER_IPS, *(str(ipaddress.ip_address(h)) for h in [*declared, *assigned]
                                              if _is_ip(h))]))  # fmt: skip


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """A CA signs certificates and revocation lists; a server signs its TLS handshakes (ECDHE)."""
    return x509.KeyUsage(
        digital_signature=not signs_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not signs_certificates,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(cluster: PostgresCluster, now: dt.datetime, purpose: str = "CA") -> KeyPair:
    key = _key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pg-operator"),
            # Dated, so the CA that replaces it in a rotation has a name of its own.
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"{cluster.namespace}/{cluster.name} {purpose} {now:%Y%m%d%H%M%S}"
            ),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def new_replication_ca(cluster: PostgresCluster, now: dt.datetime) -> KeyPair:
    """The cluster's replication CA: it signs the replication role's client certificate and nothing else."""
    return new_ca(cluster, now, purpose="replication CA")


def _leaf(
    ca: KeyPair,
    now: dt.datetime,
    common_name: str,
    usage: x509.ObjectIdentifier,
    alt: list[x509.GeneralName] | None,
) -> KeyPair:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + LEAF_LIFETIME, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if alt is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return KeyPair(
        builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), _key_pem(key)
    )


def issue_server(
    cluster: PostgresCluster, ca: KeyPair, now: dt.datetime, assigned: Sequence[str] = ()
) -> KeyPair:
    """The instances' server certificate, signed by the cluster's CA; `assigned` as for server_dns_names."""
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_dns_names(cluster, assigned=assigned)]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ip_addresses(cluster, assigned)]
    return _leaf(ca, now, names.rw_host(cluster), ExtendedKeyUsageOID.SERVER_AUTH, alt)


def issue_client(ca: KeyPair, role: str, now: dt.datetime) -> KeyPair:
    """A client certificate for a database role: PostgreSQL's `cert` method takes the role from the CN."""
    return _leaf(ca, now, role, ExtendedKeyUsageOID.CLIENT_AUTH, None)


def secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    raw = ((secret or {}).get("data") or {}).get(key)
    try:
        return base64.b64decode(str(raw), validate=True) if raw else None
    except ValueError:
        return None


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def pem_certificates(bundle: bytes | None) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM block with a newline."""
    return [m.group(0) + b"\n" for m in _PEM_CERT.finditer(bundle or b"")]


def trust_while_leaves_change(observed_trust: bytes | None, trust_pem: bytes) -> bytes:
    """The bundle to write with new leaves: the wanted one plus every CA the instances trust now. A CA
    leaves the bundle only in a later write, once every instance serves the new leaves (an instance that
    has not loaded them yet still presents a certificate the old CA signed)."""
    wanted = pem_certificates(trust_pem)
    kept = [c for c in pem_certificates(observed_trust) if c not in wanted]
    return trust_pem + b"".join(kept)


def issued_by(cert: x509.Certificate, ca: KeyPair) -> bool:
    """Signed by this CA's key (names alone do not tell two CAs of one cluster apart)."""
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def ca_from_secret(secret: Mapping[str, Any] | None) -> KeyPair | None:
    cert, key = secret_bytes(secret, CA_CERT_KEY), secret_bytes(secret, CA_KEY_KEY)
    if not cert or not key:
        return None
    try:
        x509.load_pem_x509_certificate(cert)
        serialization.load_pem_private_key(key, password=None)
    except ValueError:
        return None
    return KeyPair(cert, key)


def server_renewal(
    cluster: PostgresCluster,
    ca: KeyPair,
    secret: Mapping[str, Any] | None,
    now: dt.datetime,
    trust_pem: bytes | None = None,
    assigned: Sequence[str] = (),
) -> str | None:
    """Why the server certificate must be (re-)issued now, or None while it is good. `ca` signs the
    leaves; `trust_pem` is what the instances must trust (the CA bundle during a rotation)."""
    cert_pem = secret_bytes(secret, TLS_CERT_KEY)
    if not cert_pem or not secret_bytes(secret, TLS_KEY_KEY):
        return "no server certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "the server certificate cannot be read"
    if not issued_by(cert, ca):
        return "the certificate authority changed"
    if secret_bytes(secret, CA_CERT_KEY) != (trust_pem or ca.cert_pem):
        return TRUST_CHANGED
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the server certificate names no host"
    if sorted(sans.get_values_for_type(x509.DNSName)) != sorted(server_dns_names(cluster, assigned=assigned)):
        return "the names the server certificate must carry changed"
    if sorted(str(ip) for ip in sans.get_values_for_type(x509.IPAddress)) != sorted(
        server_ip_addresses(cluster, assigned)
    ):
        return "the addresses the server certificate must carry changed"
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= end - (end - start) / 3:
        return f"the server certificate expires at {end.isoformat()}"
    return None


@dataclass(frozen=True)
class ReplicationTrust:
    """What Secret `<name>-server-tls` must hold for replication: whether the replication role's client
    certificate is (re-)issued by the replication CA now, the CAs the instances accept client certificates
    from (`replication-ca.crt`), and why anything is written (None: nothing)."""

    reissue: bool
    bundle: bytes
    why: str | None = None


def _client_problem(cert_pem: bytes | None, key_pem: bytes | None, now: dt.datetime) -> str | None:
    if not cert_pem or not key_pem:
        return "no replication client certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "the replication client certificate cannot be read"
    if cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value != REPLICATION_USER:
        return "the replication client certificate names another role"
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= end - (end - start) / 3:
        return f"the replication client certificate expires at {end.isoformat()}"
    return None


def _signed_by(cert_pem: bytes | None, ca_pem: bytes) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem) if cert_pem else None
    except ValueError:
        return False
    return cert is not None and issued_by(cert, KeyPair(ca_pem, b""))


def replication_trust(
    replication_ca: KeyPair, secret: Mapping[str, Any] | None, now: dt.datetime, *, everyone_loaded: bool
) -> ReplicationTrust:
    """The replication client certificate and its trust, moved without a refused replication connection
    from a Secret written before the replication CA existed (whose leaf another CA signed, trusted through
    `ca.crt`): first the instances trust the replication CA beside that leaf's issuer; once every running
    instance loaded that, the leaf is re-issued by the replication CA; once every one loaded the new leaf,
    only the replication CA is trusted. `everyone_loaded`: every running instance runs exactly `secret`."""
    ca_pem = replication_ca.cert_pem
    observed = secret_bytes(secret, REPLICATION_CA_KEY)
    leaf = secret_bytes(secret, REPLICATION_CERT_KEY)
    if secret is None or not leaf:
        return ReplicationTrust(True, ca_pem, "no replication client certificate yet")
    trusted = pem_certificates(observed)
    if ca_pem not in trusted:
        # Trust first: the replication CA beside whatever signed the leaf the instances present now.
        issuers = [c for c in pem_certificates(secret_bytes(secret, CA_CERT_KEY)) + trusted
                   if _signed_by(leaf, c)]  # fmt: skip
        return ReplicationTrust(
            False,
            ca_pem + b"".join(dict.fromkeys(issuers)),
            "trusting the replication CA before presenting its certificate",
        )
    if not _signed_by(leaf, ca_pem):
        if not everyone_loaded:
            return ReplicationTrust(False, observed or ca_pem)
        return ReplicationTrust(
            True, observed or ca_pem, "the replication certificate moves to the replication CA"
        )
    if trusted != [ca_pem]:
        if not everyone_loaded:
            return ReplicationTrust(False, observed or ca_pem)
        return ReplicationTrust(False, ca_pem, "only the replication CA is trusted for client certificates")
    problem = _client_problem(leaf, secret_bytes(secret, REPLICATION_KEY_KEY), now)
    return ReplicationTrust(problem is not None, ca_pem, problem)


# A certificate this close to its end that is still in use was not renewed (a leaf is renewed with 30 days
# left) or cannot be (the CA: a rotation is the user's step for now): the cluster reports it.
WARN_BEFORE = dt.timedelta(days=21)


def certificates_in_use(
    ca_secret_body: Mapping[str, Any] | None, server_secret_body: Mapping[str, Any] | None
) -> dict[str, dt.datetime]:
    """The expiry of each certificate a cluster depends on, by role: `ca`, `server`, `replication`."""
    found = {"ca": expiry(ca_secret_body, CA_CERT_KEY), "server": expiry(server_secret_body, TLS_CERT_KEY),
             "replication": expiry(server_secret_body, REPLICATION_CERT_KEY)}  # fmt: skip
    return {role: end for role, end in found.items() if end is not None}


def expiring(in_use: Mapping[str, dt.datetime], now: dt.datetime) -> str | None:
    """What to tell the user about certificates near their end (or past it), None when all are fine."""
    soon = sorted((end, role) for role, end in in_use.items() if end - now <= WARN_BEFORE)
    if not soon:
        return None
    parts = [f"the {role} certificate {'expired' if end <= now else 'expires'} at {end.isoformat()}"
             for end, role in soon]  # fmt: skip
    return "; ".join(parts)


def expiry(secret: Mapping[str, Any] | None, key: str = TLS_CERT_KEY) -> dt.datetime | None:
    pem = secret_bytes(secret, key)
    if not pem:
        return None
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc
    except ValueError:
        return None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ca_secret(cluster: PostgresCluster, ca: KeyPair) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(cluster, names.ca_secret(cluster), COMPONENT_CREDENTIALS),
        "type": "Opaque",
        "data": {CA_CERT_KEY: b64(ca.cert_pem), CA_KEY_KEY: b64(ca.key_pem)},
    }


def server_secret(cluster: PostgresCluster, ca: KeyPair, server: KeyPair, replication: KeyPair,
                  trust_pem: bytes | None = None, replication_trust_pem: bytes | None = None
                  ) -> dict[str, Any]:  # fmt: skip
    """`ca` signed the server leaf; `trust_pem` (default: that CA) is the bundle the instances verify
    servers with; `replication_trust_pem` the CAs they accept client certificates from."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(cluster, names.server_tls_secret(cluster), COMPONENT_CREDENTIALS),
        "type": "kubernetes.io/tls",
        "data": {
            TLS_CERT_KEY: b64(server.cert_pem),
            TLS_KEY_KEY: b64(server.key_pem),
            CA_CERT_KEY: b64(trust_pem or ca.cert_pem),
            REPLICATION_CERT_KEY: b64(replication.cert_pem),
            REPLICATION_KEY_KEY: b64(replication.key_pem),
            **({REPLICATION_CA_KEY: b64(replication_trust_pem)} if replication_trust_pem else {}),
        },
    }
