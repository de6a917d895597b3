"""`certs`: the certificates of a cluster's TLS Secrets (`<name>-ca`, `<name>-server-tls`, see
docs/tls.md): subject, names, expiry and time left, soonest first. Exits NOT_READY when one has expired
or a Secret is missing."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator.cli.pgc.connection import Connection, api_error, get_cluster
from pg_operator.cli.pgc.errors import NOT_READY, OK
from pg_operator.cli.pgc.status import human_age


def certificates(secret_name: str, data: Mapping[str, str] | None, now: datetime) -> list[dict[str, Any]]:
    """Each readable certificate among a Secret's `*.crt` keys (base64 as the API returns them)."""
    found: list[dict[str, Any]] = []
    for key, value in sorted((data or {}).items()):
        if not key.endswith(".crt"):
            continue
        try:
            cert = x509.load_pem_x509_certificate(base64.b64decode(value))
        except ValueError:
            found.append({"secret": secret_name, "key": key, "error": "not a PEM certificate"})
            continue
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            dns = san.get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            dns = []
        end = cert.not_valid_after_utc
        subject = str(cn[0].value) if cn else cert.subject.rfc4514_string()
        found.append(
            {
                "secret": secret_name,
                "key": key,
                "subject": subject,
                "dnsNames": len(dns),
                "notAfter": end.isoformat(),
                "secondsLeft": int((end - now).total_seconds()),
            }
        )
    return found


def render(certs: list[dict[str, Any]], missing: list[str]) -> str:
    lines = [f"{'SECRET/KEY':34} {'SUBJECT':22} {'DNS NAMES':9} {'NOT AFTER':26} LEFT"]
    for c in sorted(certs, key=lambda c: c.get("secondsLeft", -(2**62))):
        if "error" in c:
            lines.append(f"{c['secret'] + '/' + c['key']:34} {c['error']}")
            continue
        left = c["secondsLeft"]
        where = f"{c['secret']}/{c['key']}"
        lines.append(
            f"{where:34} {c['subject']:22} {c['dnsNames']:<9} {c['notAfter']:26} "
            + ("EXPIRED" if left <= 0 else human_age(left))
        )
    lines += [f"{name}: missing" for name in missing]
    return "\n".join(lines)


def run(conn: Connection, name: str, output: str) -> int:
    get_cluster(conn, name)
    now = datetime.now(UTC)
    certs: list[dict[str, Any]] = []
    missing = []
    for secret_name in (f"{name}-ca", f"{name}-server-tls"):
        try:
            secret = conn.client.get(Secret, secret_name, namespace=conn.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise api_error(exc) from None
            missing.append(secret_name)
            continue
        certs += certificates(secret_name, secret.data, now)
    print(
        json.dumps({"certificates": certs, "missingSecrets": missing}, indent=2)
        if output == "json"
        else render(certs, missing)
    )
    bad = missing or any("error" in c or c["secondsLeft"] <= 0 for c in certs)
    return NOT_READY if bad else OK
