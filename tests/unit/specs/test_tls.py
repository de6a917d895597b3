"""The cluster's CA and server certificate: names, chain, renewal, and no key in a repr."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.objects import cluster_model as cluster
from pg_operator.specs.tls import (
    LEAF_LIFETIME,
    ReplicationTrust,
    ca_from_secret,
    ca_secret,
    certificates_in_use,
    expiring,
    issue_client,
    issue_server,
    new_ca,
    new_replication_ca,
    pem_certificates,
    replication_trust,
    server_dns_names,
    server_renewal,
    server_secret,
    trust_while_leaves_change,
)

NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_the_server_certificate_names_every_service_every_pod_and_loopback() -> None:
    names = server_dns_names(cluster())
    for svc in ("orders-db", "orders-db-rw", "orders-db-ro", "orders-db-r"):
        assert {svc, f"{svc}.shop", f"{svc}.shop.svc", f"{svc}.shop.svc.cluster.local"} <= set(names)
    assert {"*.orders-db.shop.svc", "*.orders-db.shop.svc.cluster.local", "localhost"} <= set(names)
    ca = new_ca(cluster(), NOW)
    leaf = cert(issue_server(cluster(), ca, NOW).cert_pem)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(names)
    assert set(sans.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1"),
                                                             ipaddress.ip_address("::1")}  # fmt: skip


def test_the_chain_verifies_and_the_lifetimes_are_bounded() -> None:
    ca = new_ca(cluster(), NOW)
    ca_cert, leaf = cert(ca.cert_pem), cert(issue_server(cluster(), ca, NOW).cert_pem)
    leaf.verify_directly_issued_by(ca_cert)  # raises on a wrong issuer or signature
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert leaf.not_valid_after_utc - NOW == LEAF_LIFETIME
    assert leaf.not_valid_before_utc < NOW  # backdated for clock skew
    other = new_ca(cluster(name="other-db"), NOW)
    assert cert(other.cert_pem).subject != ca_cert.subject  # each cluster its own CA


def test_renewal_when_missing_late_in_life_renamed_or_under_another_ca() -> None:
    c = cluster()
    ca = new_ca(c, NOW)
    assert server_renewal(c, ca, None, NOW) == "no server certificate yet"
    secret = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(ca, "replicator", NOW))
    assert server_renewal(c, ca, secret, NOW) is None
    assert server_renewal(c, ca, secret, NOW + dt.timedelta(days=59)) is None
    assert (server_renewal(c, ca, secret, NOW + dt.timedelta(days=61)) or "").startswith(
        "the server certificate expires at"
    )
    assert server_renewal(c, new_ca(c, NOW), secret, NOW) == "the certificate authority changed"
    renamed = cluster(namespace="other")  # the names it must carry changed
    assert server_renewal(renamed, ca, secret, NOW) == "the names the server certificate must carry changed"
    broken = {**secret, "data": {**secret["data"], "tls.crt": base64.b64encode(b"junk").decode()}}
    assert server_renewal(c, ca, broken, NOW) == "the server certificate cannot be read"


def test_the_replication_certificate_is_the_replication_cas_renewed_and_naming_its_role() -> None:
    c = cluster()
    ca, repl = new_ca(c, NOW), new_replication_ca(c, NOW)
    assert replication_trust(repl, None, NOW, everyone_loaded=True) == ReplicationTrust(
        True, repl.cert_pem, "no replication client certificate yet"
    )
    secret = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(repl, "replicator", NOW),
                           replication_trust_pem=repl.cert_pem)  # fmt: skip
    steady = replication_trust(repl, secret, NOW, everyone_loaded=False)
    assert steady == ReplicationTrust(False, repl.cert_pem)
    late = replication_trust(repl, secret, NOW + dt.timedelta(days=61), everyone_loaded=False)
    assert late.reissue and (late.why or "").startswith("the replication client certificate expires at")
    other_role = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(repl, "postgres", NOW),
                               replication_trust_pem=repl.cert_pem)  # fmt: skip
    assert replication_trust(repl, other_role, NOW, everyone_loaded=True).why == (
        "the replication client certificate names another role"
    )


def test_a_secret_from_before_the_replication_ca_moves_to_it_in_three_loaded_steps() -> None:
    """Each step waits until every running instance loaded the previous one, so no instance ever presents
    a replication certificate a peer does not trust."""
    c = cluster()
    ca, repl = new_ca(c, NOW), new_replication_ca(c, NOW)
    old = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(ca, "replicator", NOW))
    first = replication_trust(repl, old, NOW, everyone_loaded=False)  # trusting comes first, at once
    assert not first.reissue and first.bundle == repl.cert_pem + ca.cert_pem and first.why
    trusting = {**old, "data": {**old["data"], "replication-ca.crt": base64.b64encode(first.bundle).decode()}}
    waiting = replication_trust(repl, trusting, NOW, everyone_loaded=False)
    assert waiting == ReplicationTrust(False, first.bundle)
    second = replication_trust(repl, trusting, NOW, everyone_loaded=True)
    assert second.reissue and second.bundle == first.bundle and second.why
    moved = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(repl, "replicator", NOW),
                          replication_trust_pem=first.bundle)  # fmt: skip
    assert replication_trust(repl, moved, NOW, everyone_loaded=False) == ReplicationTrust(False, first.bundle)
    third = replication_trust(repl, moved, NOW, everyone_loaded=True)
    assert not third.reissue and third.bundle == repl.cert_pem and third.why
    done = {
        **moved,
        "data": {**moved["data"], "replication-ca.crt": base64.b64encode(repl.cert_pem).decode()},
    }
    assert replication_trust(repl, done, NOW, everyone_loaded=True) == ReplicationTrust(False, repl.cert_pem)


def test_the_replication_client_certificate() -> None:
    c = cluster()
    ca = new_ca(c, NOW)
    client = cert(issue_client(ca, "replicator", NOW).cert_pem)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "replicator"
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.issuer == cert(ca.cert_pem).subject
    client.verify_directly_issued_by(cert(ca.cert_pem))
    with pytest.raises(x509.ExtensionNotFound):  # a client certificate names no host
        client.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_secrets_round_trip_and_no_key_in_a_repr() -> None:
    c = cluster()
    ca = new_ca(c, NOW)
    assert ca_from_secret(ca_secret(c, ca)) == ca
    assert ca_from_secret({"data": {"ca.crt": "bm9wZQ=="}}) is None
    server = issue_server(c, ca, NOW)
    repl = new_replication_ca(c, NOW)
    secret = server_secret(
        c, ca, server, issue_client(repl, "replicator", NOW), replication_trust_pem=repl.cert_pem
    )
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {
        "tls.crt",
        "tls.key",
        "ca.crt",
        "replication.crt",
        "replication.key",
        "replication-ca.crt",
    }
    assert "ca.key" not in secret["data"]  # the CA's key stays in <name>-ca
    assert "PRIVATE" not in repr(ca) + repr(server)
    assert secret["metadata"]["ownerReferences"][0]["controller"] is True


def test_certificates_in_use_and_when_one_is_reported_as_expiring() -> None:
    c = cluster()
    ca = new_ca(c, NOW)
    server = server_secret(c, ca, issue_server(c, ca, NOW), issue_client(ca, "replicator", NOW))
    in_use = certificates_in_use(ca_secret(c, ca), server)
    assert set(in_use) == {"ca", "server", "replication"}
    assert in_use["server"] == in_use["replication"] == NOW + dt.timedelta(days=90)
    assert certificates_in_use(None, None) == {}
    assert expiring(in_use, NOW) is None
    assert expiring(in_use, NOW + dt.timedelta(days=68)) is None  # 22 days left: renewal's business
    late = expiring(in_use, NOW + dt.timedelta(days=70))
    assert late is not None and "the server certificate expires at" in late
    assert "the replication certificate expires at" in late and "the ca certificate" not in late
    gone = expiring(in_use, NOW + dt.timedelta(days=91))
    assert gone is not None and "expired at" in gone


def test_a_ca_leaves_the_bundle_only_after_the_leaves_it_signed() -> None:
    c = cluster()
    old, new = new_ca(c, NOW), new_ca(c, NOW + dt.timedelta(seconds=1))
    assert pem_certificates(old.cert_pem + new.cert_pem) == [old.cert_pem, new.cert_pem]
    assert pem_certificates(None) == []
    # New leaves signed by `new`, while the instances still trust (and some present leaves of) `old`.
    assert trust_while_leaves_change(old.cert_pem, new.cert_pem) == new.cert_pem + old.cert_pem
    assert trust_while_leaves_change(new.cert_pem + old.cert_pem, new.cert_pem + old.cert_pem) == (
        new.cert_pem + old.cert_pem
    )
    assert trust_while_leaves_change(None, new.cert_pem) == new.cert_pem
