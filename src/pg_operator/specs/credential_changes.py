"""Credentials as the cluster's Secrets hold them: which Secret carries a password the database has not been
given yet, the SQL that gives it (a SCRAM verifier, never the password), and the application Secret's keys
that derive from its password.

What the operator applied is recorded on each Secret as the annotation `APPLIED_ANNOTATION`: a SHA-256 over
the Secret's uid, username and password. The uid salts it, so a Secret deleted and recreated (by the user
or by the operator) never matches its predecessor and is applied again; whoever can read the annotation
can read the password beside it, so it discloses nothing new. No function here puts a password into a
repr, an error or a message.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import GROUP, PATRONI_API_USER, REPLICATION_USER, SUPERUSER
from pg_operator.privileged_sql import QUIET_SQL
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs import names
from pg_operator.specs.secrets import app_connection, decoded, gone_keys

APPLIED_ANNOTATION = f"{GROUP}/credential-applied"


@dataclass(frozen=True)
class Slot:
    """One credential Secret of a cluster and the role it stands for."""

    kind: str  # superuser, replication, app, patroni-api (the instance's mount names)
    secret: str
    username: str  # the role (or Patroni API user) the Secret must name
    has_role: bool  # a database role holds this password (the Patroni API user is not a role)


def slots(cluster: PostgresCluster) -> list[Slot]:
    return [
        Slot("superuser", names.superuser_secret(cluster), SUPERUSER, True),
        Slot("replication", names.replication_secret(cluster), REPLICATION_USER, True),
        Slot("app", names.app_secret(cluster), cluster.spec.bootstrap.initdb.owner, True),
        Slot("patroni-api", names.patroni_api_secret(cluster), PATRONI_API_USER, False),
    ]


@dataclass(frozen=True)
class Change:
    """A Secret whose password the operator has not applied yet."""

    slot: Slot
    resource_version: str | None
    fingerprint: str
    password: str = field(repr=False)

    def describe(self) -> str:
        if self.slot.has_role:
            return f"the password of role {self.slot.username} (Secret {self.slot.secret})"
        return f"the Patroni REST API password (Secret {self.slot.secret})"


@dataclass(frozen=True)
class Plan:
    changes: list[Change] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why a Secret cannot be applied, naming it and the key

    @property
    def role_changes(self) -> list[Change]:
        return [c for c in self.changes if c.slot.has_role]


def fingerprint(secret_uid: str, username: str, password: str) -> str:
    digest = hashlib.sha256(f"{secret_uid}\0{username}\0{password}".encode()).hexdigest()
    return f"sha256:{digest}"


def plan(cluster: PostgresCluster, secrets: Mapping[str, Mapping[str, Any] | None]) -> Plan:
    """What to apply, from the Secrets the cache holds by name. A missing Secret is not here: the operator
    creates it (with a new password) and the next reconcile finds it unapplied."""
    result = Plan()
    for slot in slots(cluster):
        secret = secrets.get(slot.secret)
        if secret is None or objects.deleting(secret):
            continue
        username = (decoded(secret, "username") or "").strip()
        password = decoded(secret, "password")
        # The instance reads the same keys and forgives one trailing newline (instance/inputs.py).
        password = password[:-1] if password and password.endswith("\n") else password
        if username != slot.username:
            result.refused.append(
                f"Secret {slot.secret}: key username is {username!r}, but it must be {slot.username!r} "
                "(a role's name does not change through its Secret)"
            )
            continue
        if not password:
            result.refused.append(f"Secret {slot.secret}: key password is missing, empty or not UTF-8")
            continue
        if "\n" in password or "\0" in password:
            result.refused.append(f"Secret {slot.secret}: key password contains a newline or NUL byte")
            continue
        mark = fingerprint(objects.uid(secret), username, password)
        if objects.annotation(secret, APPLIED_ANNOTATION) != mark:
            result.changes.append(Change(slot, objects.resource_version(secret), mark, password))
    return result


def _quoted_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def role_sql(changes: Sequence[Change], *, salt: bytes | None = None) -> str:
    """One script setting every changed role's password, as a verifier, with statement logging off."""
    statements = [QUIET_SQL]
    for change in changes:
        if not change.slot.has_role:
            continue
        verifier = scram_sha256_verifier(change.password, salt=salt)
        statements.append(f"ALTER ROLE {_quoted_identifier(change.slot.username)} PASSWORD '{verifier}';\n")
    return "".join(statements)


def applied_patch(cluster: PostgresCluster, change: Change, secret: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch recording the change as applied, conditional on the version it was read at; for the
    application Secret also the keys derived from the password (URIs, pgpass) where they differ."""
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": change.resource_version,
            "annotations": {APPLIED_ANNOTATION: change.fingerprint},
        },
    }
    if change.slot.kind == "app":
        data = secret.get("data") or {}
        wanted = {
            k: base64.b64encode(v.encode()).decode("ascii")
            for k, v in app_connection(cluster, change.password).items()
        }
        differing: dict[str, str | None] = {k: v for k, v in wanted.items() if data.get(k) != v}
        differing.update(gone_keys(cluster, data))
        if differing:
            patch["data"] = differing
    return patch


def stale_app_keys(cluster: PostgresCluster, secret: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A merge patch for the application Secret when its password is applied but the keys derived from
    it are not what they should be (an older operator wrote them differently, or a hand edit); else
    None."""
    if secret is None or objects.deleting(secret):
        return None
    password = decoded(secret, "password")
    password = password[:-1] if password and password.endswith("\n") else password
    username = (decoded(secret, "username") or "").strip()
    if not password or objects.annotation(secret, APPLIED_ANNOTATION) != fingerprint(
        objects.uid(secret), username, password
    ):
        return None
    app = next(slot for slot in slots(cluster) if slot.kind == "app")
    change = Change(app, objects.resource_version(secret), "", password)
    patch = applied_patch(cluster, change, secret)
    if "data" not in patch:
        return None
    del patch["metadata"]["annotations"]
    return patch


def without_verifiers(text: str) -> str:
    """psql's output, for a message: any line that could quote a verifier is left out."""
    return "\n".join(line for line in text.splitlines() if "SCRAM-SHA-256$" not in line).strip()
