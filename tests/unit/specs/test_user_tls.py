"""Certificates the user brings: what is accepted, and what is refused naming the Secret and the key."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from harness.objects import cluster_model as cluster
from pg_operator.specs import tls
from pg_operator.specs.user_tls import trust_bundle, user_ca, user_server, user_server_renewal

NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)
C = cluster()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret(**data: bytes) -> dict[str, Any]:
    return {"data": {k.replace("_", "."): b64(v) for k, v in data.items()}}


def certificate(
    names: list[str], signer: tls.KeyPair, *, ips: tuple[str, ...] = tls.SERVER_IPS, days: int = 90
) -> tuple[bytes, bytes]:
    """A server certificate as a certificate manager would make it (RSA, PKCS#1 key), signed by `signer`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signer_cert = x509.load_pem_x509_certificate(signer.cert_pem)
    signer_key = serialization.load_pem_private_key(signer.key_pem, password=None)
    assert isinstance(signer_key, ec.EllipticCurvePrivateKey)
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "db")]))
            .issuer_name(signer_cert.subject).public_key(key.public_key()).serial_number(7)
            .not_valid_before(NOW - dt.timedelta(days=1)).not_valid_after(NOW + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(signer_key, hashes.SHA256()))  # fmt: skip
    pkcs1 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM), pkcs1


def test_a_ca_is_taken_from_either_pair_of_keys_and_checked() -> None:
    ca = tls.new_ca(C, NOW)
    taken = user_ca("corp-ca", secret(ca_crt=ca.cert_pem, ca_key=ca.key_pem))
    assert isinstance(taken, tls.KeyPair) and taken.cert_pem == ca.cert_pem
    # A certificate manager's CA Secret: tls.crt and tls.key.
    assert isinstance(user_ca("corp-ca", secret(tls_crt=ca.cert_pem, tls_key=ca.key_pem)), tls.KeyPair)
    assert "is not there" in str(user_ca("corp-ca", None))
    assert user_ca("corp-ca", secret(ca_crt=ca.cert_pem)) == (
        "Secret corp-ca (spec.tls.caSecret) holds neither ca.crt and ca.key nor tls.crt and tls.key"
    )
    other = tls.new_ca(C, NOW)
    assert user_ca("corp-ca", secret(ca_crt=ca.cert_pem, ca_key=other.key_pem)) == (
        "Secret corp-ca key ca.key: not the private key of ca.crt (or encrypted)"
    )
    leaf, key = certificate(["x"], ca)
    assert user_ca("corp-ca", secret(ca_crt=leaf, ca_key=key)) == (
        "Secret corp-ca key ca.crt: the certificate is not a CA (basicConstraints CA:TRUE)"
    )


def test_a_server_certificate_must_name_every_name_and_chain_to_its_ca() -> None:
    ca = tls.new_ca(C, NOW)
    names = tls.server_dns_names(C)
    cert, key = certificate(names, ca)
    taken = user_server(C, "db-cert", secret(tls_crt=cert, tls_key=key, ca_crt=ca.cert_pem), NOW)
    assert not isinstance(taken, str) and taken.cert_pem == cert and "PRIVATE" not in repr(taken)
    short, short_key = certificate([n for n in names if "-ro" not in n], ca)
    refused = user_server(C, "db-cert", secret(tls_crt=short, tls_key=short_key, ca_crt=ca.cert_pem), NOW)
    assert isinstance(refused, str)
    assert refused.startswith("Secret db-cert key tls.crt: does not name orders-db-ro")
    no_loopback, nl_key = certificate(names, ca, ips=())
    refused = user_server(C, "db-cert", secret(tls_crt=no_loopback, tls_key=nl_key, ca_crt=ca.cert_pem), NOW)
    assert isinstance(refused, str) and "127.0.0.1" in refused
    stranger = tls.new_ca(C, NOW)
    assert user_server(C, "db-cert", secret(tls_crt=cert, tls_key=key, ca_crt=stranger.cert_pem), NOW) == (
        "Secret db-cert key ca.crt: holds no certificate that issued tls.crt"
    )
    _, wrong_key = certificate(names, ca)
    assert user_server(C, "db-cert", secret(tls_crt=cert, tls_key=wrong_key, ca_crt=ca.cert_pem), NOW) == (
        "Secret db-cert key tls.key: not the private key of tls.crt (or encrypted)"
    )
    assert user_server(C, "db-cert", secret(tls_crt=cert, ca_crt=ca.cert_pem), NOW) == (
        "Secret db-cert (spec.tls.serverSecret) lacks tls.key"
    )
    late = user_server(C, "db-cert", secret(tls_crt=cert, tls_key=key, ca_crt=ca.cert_pem),
                       NOW + dt.timedelta(days=91))  # fmt: skip
    assert isinstance(late, str) and "expired at" in late


def test_the_server_secret_follows_the_users_certificate() -> None:
    cluster_ca, corp = tls.new_ca(C, NOW), tls.new_ca(C, NOW)
    cert, key = certificate(tls.server_dns_names(C), corp)
    user = user_server(C, "db-cert", secret(tls_crt=cert, tls_key=key, ca_crt=corp.cert_pem), NOW)
    assert not isinstance(user, str)
    trust = trust_bundle(cluster_ca.cert_pem, user)
    assert trust == corp.cert_pem + cluster_ca.cert_pem  # the user's CA first, then the cluster's
    assert trust_bundle(cluster_ca.cert_pem, None) == cluster_ca.cert_pem
    written = tls.server_secret(C, cluster_ca, tls.KeyPair(user.cert_pem, user.key_pem),
                                tls.issue_client(cluster_ca, "replicator", NOW), trust)  # fmt: skip
    assert user_server_renewal(user, trust, written) is None
    renewed, renewed_key = certificate(tls.server_dns_names(C), corp)
    fresh = user_server(C, "db-cert", secret(tls_crt=renewed, tls_key=renewed_key, ca_crt=corp.cert_pem), NOW)
    assert not isinstance(fresh, str)
    changed = user_server_renewal(fresh, trust, written)
    assert changed == "the user's server certificate changed"
    assert user_server_renewal(user, cluster_ca.cert_pem, written) == (
        "the trusted certificate authorities changed"
    )
