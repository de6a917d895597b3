"""`kubectl pgc backup` and `certs`: the Backup's name and body, its status in one line, and what a
TLS Secret's certificates say."""

from __future__ import annotations

import base64
import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pg_operator.cli.pgc.backup import backup_body, backup_name, describe
from pg_operator.cli.pgc.certs import certificates, render

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def test_backup_names_carry_the_time_and_fit_a_name() -> None:
    assert backup_name("orders-db", NOW) == "orders-db-20261202120000"
    long = backup_name("a" * 60, NOW)
    assert len(long) <= 63 and long.endswith("-20261202120000")


def test_backup_body_names_the_cluster() -> None:
    assert backup_body("b1", "shop", "orders-db") == {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "b1", "namespace": "shop"},
        "spec": {"cluster": "orders-db"},
    }


def test_backup_status_in_one_line() -> None:
    assert describe({}) == "Pending"
    assert describe({"phase": "Running"}) == "Running"
    assert describe({"phase": "Failed", "error": "store unreachable"}) == "Failed: store unreachable"
    done = describe(
        {
            "phase": "Completed",
            "backupID": "20261202T120000",
            "instance": "db-1",
            "size": 123,
            "beginWal": "A",
            "endWal": "B",
        }
    )
    assert done == "Completed: 20261202T120000 on db-1, 123 bytes, WAL A..B"


def pem(cn: str, days: int, names: list[str]) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=days))
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
    cert = builder.sign(key, hashes.SHA256())
    return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()


def test_certificates_of_a_secret_with_expiry_and_names() -> None:
    data = {
        "tls.crt": pem("db-rw", 30, ["db-rw", "db-rw.shop"]),
        "tls.key": "c2VjcmV0",
        "ca.crt": pem("db CA", -1, []),
        "broken.crt": base64.b64encode(b"nope").decode(),
    }
    found = {c["key"]: c for c in certificates("db-server-tls", data, NOW)}
    assert set(found) == {"tls.crt", "ca.crt", "broken.crt"}  # never the key
    assert found["tls.crt"]["subject"] == "db-rw" and found["tls.crt"]["dnsNames"] == 2
    assert found["tls.crt"]["secondsLeft"] == 30 * 86400
    assert found["ca.crt"]["secondsLeft"] < 0
    screen = render(list(found.values()), ["db-ca"])
    lines = screen.splitlines()
    assert "broken.crt" in lines[1]  # unreadable first, then the soonest to expire
    assert "EXPIRED" in lines[2] and "db-server-tls/ca.crt" in lines[2]
    assert lines[3].endswith("30d0h") and lines[-1] == "db-ca: missing"
