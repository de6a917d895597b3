"""Declared roles and databases (`spec.roles`, `spec.databases`): what is declared, the quoting every
statement uses, the generated role Secrets, the passwords and the status entries. Pure: no I/O. The SQL
that reads what the database holds is `role_reads.py`, the SQL that converges it `role_changes.py`.

What is managed is marked in the database itself: a comment (`MARKER`) on each role and database the
operator created or took over. A role or database that carries it but is no longer declared was removed
from the spec, and the removal policy decides (retain: the comment is cleared; delete: dropped) — so
removal needs no memory outside the database and survives an operator restart.

Passwords: the Secret (generated `<cluster>-<role>` or one the user names) is the source of truth; the
database's SCRAM verifier is checked against it (same salt and iterations) and replaced when it does not
match, so a password edited in its Secret or changed by hand in the database is put back on the next
check, and nothing is written to a user's Secret. A verifier only ever travels on a psql's stdin or
stdout; no function here puts a password or verifier in a repr, an error or a message.

Every name is quoted as an identifier (`ident`) or a literal (`literal`) where it enters SQL, even though
admission already restricts names to identifier characters.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import CLUSTER_LABEL, GROUP
from pg_operator.api.roles import Database, Role, secret_suffix
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs.labels import COMPONENT_CREDENTIALS, child_metadata
from pg_operator.specs.secrets import APP_CA_KEY, PASSWORD_BYTES, connection_keys, decoded, gone_keys

# On each role and database the operator manages (COMMENT ON ...).
MARKER = "managed by pg-operator"
# Where extensions that are not trusted go: a schema the operator creates, owned by the superuser, in
# which no tenant can create objects. An untrusted extension's script runs as the superuser with its
# target schema first in its search path, so a tenant-writable target (such as `public`, which the
# database's owner owns) would let the tenant plant what the script then calls.
EXTENSION_SCHEMA = "extensions"
# On each generated role Secret: the role it holds the password of.
ROLE_LABEL = f"{GROUP}/role"
SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")


# --- quoting --------------------------------------------------------------------------------------------


def ident(name: str) -> str:
    """A quoted identifier (PostgreSQL's quote_ident, always quoting)."""
    if "\0" in name:
        raise ValueError("an identifier must not contain a NUL byte")
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    """A quoted string literal, for standard_conforming_strings = on (set by every script here)."""
    if "\0" in value:
        raise ValueError("a literal must not contain a NUL byte")
    return "'" + value.replace("'", "''") + "'"


def meta_name(name: str) -> str:
    """A database name on a psql meta-command line (\\connect), where SQL quoting does not apply: only
    names admission allows (identifier characters) are accepted."""
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain identifier")
    return name


def text_array(values: Sequence[str]) -> str:
    if not values:
        return "ARRAY[]::pg_catalog.text[]"
    return "ARRAY[" + ", ".join(literal(v) for v in values) + "]::pg_catalog.text[]"


# --- what is declared ---------------------------------------------------------------------------------


def declared_roles(cluster: PostgresCluster) -> list[Role]:
    return list(cluster.spec.roles or [])


def declared_databases(cluster: PostgresCluster) -> list[Database]:
    return list(cluster.spec.databases or [])


def declares_anything(cluster: PostgresCluster) -> bool:
    return bool(cluster.spec.roles or cluster.spec.databases)


def role_secret_name(cluster: PostgresCluster, role: str) -> str:
    return f"{cluster.name}-{secret_suffix(role)}"


def generates_secret(role: Role) -> bool:
    return role.login and role.password_secret is None


def role_dbname(cluster: PostgresCluster, role: str) -> str:
    """The database a role's Secret names: the first declared database it owns, else the application's."""
    for db in declared_databases(cluster):
        if db.owner == role:
            return db.name
    return cluster.spec.bootstrap.initdb.database


# --- generated Secrets ----------------------------------------------------------------------------------


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode("ascii")


def new_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def role_secret(cluster: PostgresCluster, role: str, password: str, ca: str | None) -> dict[str, Any]:
    """A generated role Secret, owned by the cluster (created once; the password is never rewritten)."""
    meta = child_metadata(cluster, role_secret_name(cluster, role), COMPONENT_CREDENTIALS)
    meta["labels"][ROLE_LABEL] = role
    values = connection_keys(cluster, role, role_dbname(cluster, role), password)
    if ca:
        values[APP_CA_KEY] = ca
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "kubernetes.io/basic-auth",
        "data": {k: _b64(v) for k, v in sorted(values.items())},
    }


def _password_of(secret: Mapping[str, Any], key: str = "password") -> str | None:
    value = decoded(secret, key)
    # One trailing newline is forgiven, as for the operator's own Secrets.
    return value[:-1] if value and value.endswith("\n") else value


def stale_keys(cluster: PostgresCluster, role: str, secret: Mapping[str, Any] | None,
               ca: str | None) -> dict[str, Any] | None:  # fmt: skip
    """A merge patch for a generated Secret whose derived keys (URIs, pgpass, user, dbname, ca.crt) do not
    follow its password and the cluster; None when they do (or it has no usable password)."""
    if secret is None or objects.deleting(secret):
        return None
    password = _password_of(secret)
    if not password or "\n" in password or "\0" in password:
        return None
    wanted = {
        k: _b64(v)
        for k, v in connection_keys(cluster, role, role_dbname(cluster, role), password).items()
        if k != "password"
    }
    if ca:
        wanted[APP_CA_KEY] = _b64(ca)
    data = secret.get("data") or {}
    differing: dict[str, str | None] = {k: v for k, v in wanted.items() if data.get(k) != v}
    differing.update(gone_keys(cluster, data))
    if not differing:
        return None
    return {"metadata": {"resourceVersion": objects.resource_version(secret)}, "data": differing}


def released_secrets(cluster: PostgresCluster, secrets: Sequence[Mapping[str, Any]]) -> list[str]:
    """Generated role Secrets (labelled with a role) that no declared role generates any more."""
    wanted = {role_secret_name(cluster, r.name) for r in declared_roles(cluster) if generates_secret(r)}
    return sorted(
        objects.name(s) for s in secrets
        if objects.label(s, ROLE_LABEL) and objects.name(s) not in wanted and not objects.deleting(s)
    )  # fmt: skip


def orphan_patch(secret: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch handing a generated Secret over to the user (removal policy retain: the role keeps
    its password, so its Secret stays): no owner (it outlives the cluster), and without the cluster's
    and the role's labels the operator no longer sees it."""
    return {"metadata": {"resourceVersion": objects.resource_version(secret), "ownerReferences": None,
                         "labels": {CLUSTER_LABEL: None, ROLE_LABEL: None}}}  # fmt: skip


@dataclass(frozen=True)
class Passwords:
    """Each declared role's password as its Secret holds it (None: the role's password is not managed, or
    its Secret is not there yet), and why a Secret cannot be used. Its repr names no password."""

    by_role: dict[str, str | None] = field(default_factory=dict, repr=False)
    problems: dict[str, str] = field(default_factory=dict)
    waiting: frozenset[str] = frozenset()  # generated Secrets not created yet


def passwords(cluster: PostgresCluster, secrets_by_name: Mapping[str, Mapping[str, Any]]) -> Passwords:
    """The passwords from the Secrets the cache holds (only those labelled with the cluster)."""
    by_role: dict[str, str | None] = {}
    problems: dict[str, str] = {}
    waiting = set()
    for role in declared_roles(cluster):
        if role.password_secret is not None:
            name, key = role.password_secret.name, role.password_secret.key
        elif role.login:
            name, key = role_secret_name(cluster, role.name), "password"
        else:
            by_role[role.name] = None
            continue
        secret = secrets_by_name.get(name)
        if secret is None or objects.deleting(secret):
            by_role[role.name] = None
            if role.password_secret is None:
                waiting.add(role.name)
            else:
                problems[role.name] = (
                    f"Secret {name} not found (it must exist in the cluster's namespace and "
                    f"carry the label {CLUSTER_LABEL}={cluster.name})"
                )
            continue
        value = _password_of(secret, key)
        if not value:
            problems[role.name] = f"Secret {name}: key {key} is missing, empty or not UTF-8"
            by_role[role.name] = None
        elif "\n" in value or "\0" in value:
            problems[role.name] = f"Secret {name}: key {key} contains a newline or NUL byte"
            by_role[role.name] = None
        else:
            by_role[role.name] = value
    return Passwords(by_role, problems, frozenset(waiting))


def password_sources(cluster: PostgresCluster) -> list[str]:
    """Names of the Secrets the declared roles' passwords come from (their versions trigger a check)."""
    out = []
    for role in declared_roles(cluster):
        if role.password_secret is not None:
            out.append(role.password_secret.name)
        elif role.login:
            out.append(role_secret_name(cluster, role.name))
    return out


def verifier_matches(password: str, verifier: str | None) -> bool:
    """Whether a SCRAM-SHA-256 verifier from pg_authid was made from `password` (recomputed with its salt
    and iteration count); False for none, MD5 or anything unparsable."""
    if not verifier:
        return False
    match = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+", verifier)
    if match is None:
        return False
    try:
        salt = base64.b64decode(match.group(2), validate=True)
        iterations = int(match.group(1))
    except (binascii.Error, ValueError):
        return False
    if not 1 <= iterations <= 10_000_000:
        return False
    expected = scram_sha256_verifier(password, salt=salt, iterations=iterations)
    return hmac.compare_digest(expected.encode(), verifier.encode())


# --- status ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One line of status.roles or status.databases."""

    name: str
    applied: bool
    reason: str = ""

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "applied": self.applied}
        if self.reason:
            out["reason"] = self.reason
        return out


ROLES_CONDITION = "RolesApplied"
DATABASES_CONDITION = "DatabasesApplied"


def conditions(
    entries_roles: Sequence[Entry], entries_dbs: Sequence[Entry]
) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of RolesApplied and DatabasesApplied."""
    out = []
    for type_, kind, entries in (
        (ROLES_CONDITION, "role", entries_roles),
        (DATABASES_CONDITION, "database", entries_dbs),
    ):
        failed = [e for e in entries if not e.applied]
        if failed:
            message = "; ".join(f"{kind} {e.name}: {e.reason}" for e in failed)
            out.append((type_, False, "NotApplied", message[:4000]))
        else:
            out.append((type_, True, "Applied", f"{len(entries)} {kind}(s) as declared"))
    return out
