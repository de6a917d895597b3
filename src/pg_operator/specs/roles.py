"""Declared roles and databases (`spec.roles`, `spec.databases`): the SQL that reads what the database
holds, the SQL that converges it, the generated role Secrets and the status entries. Pure: no I/O.

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
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import CLUSTER_LABEL, GROUP, SUPERUSER
from pg_operator.api.roles import UNSAFE_MEMBERSHIPS, Database, Role, secret_suffix
from pg_operator.privileged_sql import QUIET_SQL
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
_SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")


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


def _meta_name(name: str) -> str:
    """A database name on a psql meta-command line (\\connect), where SQL quoting does not apply: only
    names admission allows (identifier characters) are accepted."""
    if not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain identifier")
    return name


def _array(values: Sequence[str]) -> str:
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


# --- observing the database -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedRole:
    name: str
    login: bool
    createdb: bool
    createrole: bool
    inherit: bool
    superuser: bool
    replication: bool
    bypassrls: bool
    connection_limit: int
    valid_until: int | None  # epoch seconds; None: no limit (or infinity)
    managed: bool
    member_of: frozenset[str]
    # Memberships held WITH ADMIN OPTION (since PostgreSQL 16 a CREATEROLE role gets one in each role it
    # creates): never revoked as undeclared.
    admin_of: frozenset[str] = frozenset()
    verifier: str | None = field(default=None, repr=False)
    # The roles of superuser power this one is a member of, directly or through others (superusers and
    # the predefined roles that run programs or reach files as the server's OS user): a member can
    # `SET ROLE` to them or use their rights.
    reaches: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ObservedDatabase:
    name: str
    owner: str
    encoding: str
    collate: str
    allow_connections: bool
    managed: bool
    extensions: frozenset[str] | None = None  # None: not read (not declared, or not connectable)
    schemas: Mapping[str, str] | None = None  # schema → owner, of the declared schemas that exist
    # The owner of the schema untrusted extensions go into, and whether it is a superuser (None: the
    # schema does not exist, or the database was not read).
    extension_schema_owner: tuple[str, bool] | None = None


@dataclass(frozen=True)
class Observed:
    roles: Mapping[str, ObservedRole]
    databases: Mapping[str, ObservedDatabase]
    available_extensions: frozenset[str]
    # Of the available ones, those a database owner may create itself (`trusted` in their control file).
    trusted_extensions: frozenset[str] = frozenset()


def _referenced_roles(cluster: PostgresCluster) -> list[str]:
    out = {r.name for r in declared_roles(cluster)}
    out.update(m for r in declared_roles(cluster) for m in r.in_roles)
    out.add(cluster.spec.bootstrap.initdb.owner)
    return sorted(out)


def _memberships(condition: str) -> str:
    return (
        "(SELECT coalesce(pg_catalog.json_agg(g.rolname ORDER BY g.rolname), '[]'::pg_catalog.json) "  # noqa: S608
        "FROM pg_catalog.pg_auth_members m "
        f"JOIN pg_catalog.pg_authid g ON g.oid = m.roleid WHERE m.member = r.oid{condition})"
    )


def _reaches() -> str:
    """The superuser-power roles role `r` is a member of, at any depth (pg_has_role follows the chain)."""
    powerful = _array(UNSAFE_MEMBERSHIPS)
    return (
        "(SELECT coalesce(pg_catalog.json_agg(g.rolname ORDER BY g.rolname), '[]'::pg_catalog.json) "  # noqa: S608
        f"FROM pg_catalog.pg_authid g WHERE (g.rolsuper OR g.rolname = ANY({powerful})) AND g.oid <> r.oid "
        "AND pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER'))"
    )


def observe_sql(cluster: PostgresCluster) -> str:
    """A psql script (run as the superuser over the socket, -AtX, in a pinned session: privileged_sql)
    printing one JSON line per part: the referenced and managed roles (with the verifiers of the declared
    ones and the superuser-power roles each reaches), every database, the available extensions (and which
    are trusted), and for each declared database that accepts connections its extensions, declared schemas
    and the owner of the schema untrusted extensions go into. Read-only. Every function and table is
    named with its schema; the session's search path is pinned again after each `\\connect`, since a
    tenant owns these databases and may set their search path."""
    declared = _array([r.name for r in declared_roles(cluster)])
    referenced = _array(_referenced_roles(cluster))
    requested = _array(sorted({e for d in declared_databases(cluster) for e in d.extensions}))
    marker = literal(MARKER)
    # Every value below is quoted by literal(); the names are admitted identifiers besides.
    roles_part = (
        "SELECT pg_catalog.json_build_object('part', 'roles', 'items', "  # noqa: S608
        "coalesce(pg_catalog.json_agg(pg_catalog.json_build_object("
        "'name', r.rolname, 'login', r.rolcanlogin, 'createdb', r.rolcreatedb, "
        "'createrole', r.rolcreaterole, 'inherit', r.rolinherit, 'superuser', r.rolsuper, "
        "'replication', r.rolreplication, 'bypassrls', r.rolbypassrls, 'connectionLimit', r.rolconnlimit, "
        "'validUntil', CASE WHEN r.rolvaliduntil IS NULL OR NOT pg_catalog.isfinite(r.rolvaliduntil) "
        "THEN NULL ELSE pg_catalog.floor(EXTRACT(epoch FROM r.rolvaliduntil))::bigint END, "
        f"'managed', coalesce(pg_catalog.shobj_description(r.oid, 'pg_authid') = {marker}, false), "
        f"'verifier', CASE WHEN r.rolname = ANY({declared}) THEN r.rolpassword END, "
        f"'memberOf', {_memberships('')}, 'adminOf', {_memberships(' AND m.admin_option')}, "
        f"'reaches', {_reaches()}"
        ") ORDER BY r.rolname), '[]'::pg_catalog.json)) FROM pg_catalog.pg_authid r "
        f"WHERE r.rolname = ANY({referenced}) OR pg_catalog.shobj_description(r.oid, 'pg_authid') = {marker};"
    )
    databases_part = (
        "SELECT pg_catalog.json_build_object('part', 'databases', 'items', "  # noqa: S608
        "coalesce(pg_catalog.json_agg(pg_catalog.json_build_object("
        "'name', d.datname, 'owner', pg_catalog.pg_get_userbyid(d.datdba), "
        "'encoding', pg_catalog.pg_encoding_to_char(d.encoding), 'collate', d.datcollate, "
        "'allowConnections', d.datallowconn, "
        f"'managed', coalesce(pg_catalog.shobj_description(d.oid, 'pg_database') = {marker}, false)"
        ") ORDER BY d.datname), '[]'::pg_catalog.json)) FROM pg_catalog.pg_database d;"
    )
    extensions_part = (
        "SELECT pg_catalog.json_build_object('part', 'extensions', 'available', "  # noqa: S608
        "coalesce(pg_catalog.json_agg(a.name ORDER BY a.name), '[]'::pg_catalog.json), 'trusted', "
        "coalesce(pg_catalog.json_agg(a.name ORDER BY a.name) FILTER (WHERE v.trusted), "
        "'[]'::pg_catalog.json)) "
        "FROM pg_catalog.pg_available_extensions a LEFT JOIN pg_catalog.pg_available_extension_versions v "
        f"ON v.name = a.name AND v.version = a.default_version WHERE a.name = ANY({requested});"
    )
    lines = [QUIET_SQL, roles_part, databases_part, extensions_part]
    for db in declared_databases(cluster):
        schemas = _array([s.name for s in db.schemas])
        exists = (
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database "  # noqa: S608
            f"WHERE datname = {literal(db.name)} AND datallowconn) AS pgop_exists \\gset"
        )
        detail = (
            "SELECT pg_catalog.json_build_object('part', 'database', "  # noqa: S608
            "'name', pg_catalog.current_database(), "
            "'extensions', (SELECT coalesce(pg_catalog.json_agg(extname ORDER BY extname), "
            "'[]'::pg_catalog.json) "
            "FROM pg_catalog.pg_extension), "
            "'schemas', (SELECT coalesce(pg_catalog.json_object_agg(nspname, "
            "pg_catalog.pg_get_userbyid(nspowner)), '{}'::pg_catalog.json) "
            f"FROM pg_catalog.pg_namespace WHERE nspname = ANY({schemas})), "
            "'extensionSchema', (SELECT pg_catalog.json_build_array(o.rolname, o.rolsuper) "
            "FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_authid o ON o.oid = n.nspowner "
            f"WHERE n.nspname = {literal(EXTENSION_SCHEMA)}));"
        )
        lines += [
            exists,
            "\\if :pgop_exists",
            f"\\connect {_meta_name(db.name)}",
            QUIET_SQL,
            detail,
            "\\endif",
        ]
    return "\n".join(lines) + "\n"


class ObservationError(ValueError):
    """The observe script's output could not be read (its text is never quoted: it holds verifiers)."""


def parse_observed(stdout: str) -> Observed:
    roles: dict[str, ObservedRole] = {}
    databases: dict[str, ObservedDatabase] = {}
    details: dict[str, dict[str, Any]] = {}
    available: frozenset[str] | None = None
    trusted: frozenset[str] = frozenset()
    seen = set()
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            part = json.loads(line)
            kind = part["part"]
            if kind == "roles":
                for r in part["items"]:
                    roles[r["name"]] = ObservedRole(
                        name=r["name"], login=bool(r["login"]), createdb=bool(r["createdb"]),
                        createrole=bool(r["createrole"]), inherit=bool(r["inherit"]),
                        superuser=bool(r["superuser"]), replication=bool(r["replication"]),
                        bypassrls=bool(r["bypassrls"]), connection_limit=int(r["connectionLimit"]),
                        valid_until=None if r["validUntil"] is None else int(r["validUntil"]),
                        managed=bool(r["managed"]), member_of=frozenset(r["memberOf"] or ()),
                        admin_of=frozenset(r.get("adminOf") or ()), verifier=r.get("verifier"),
                        reaches=frozenset(r.get("reaches") or ()),
                    )  # fmt: skip
            elif kind == "databases":
                for d in part["items"]:
                    databases[d["name"]] = ObservedDatabase(
                        name=d["name"], owner=d["owner"], encoding=d["encoding"], collate=d["collate"],
                        allow_connections=bool(d["allowConnections"]), managed=bool(d["managed"]),
                    )  # fmt: skip
            elif kind == "extensions":
                available = frozenset(part["available"] or ())
                trusted = frozenset(part.get("trusted") or ())
            elif kind == "database":
                details[part["name"]] = part
            seen.add(kind)
        except (ValueError, KeyError, TypeError) as exc:
            raise ObservationError(f"unreadable output of the roles query ({type(exc).__name__})") from None
    if not {"roles", "databases", "extensions"} <= seen or available is None:
        raise ObservationError("the roles query did not print every part")
    for name, part in details.items():
        if name in databases:
            databases[name] = ObservedDatabase(
                **{
                    **databases[name].__dict__,
                    "extensions": frozenset(part["extensions"] or ()),
                    "schemas": dict(part["schemas"] or {}),
                    "extension_schema_owner": _owner_of(part.get("extensionSchema")),
                },
            )
    return Observed(roles, databases, available, trusted)


def _owner_of(value: Any) -> tuple[str, bool] | None:
    if value is None:
        return None
    owner, superuser = value
    return str(owner), bool(superuser)


# --- converging -----------------------------------------------------------------------------------------


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


@dataclass
class Convergence:
    """The script to run (empty: nothing differs) and what the status says once it ran."""

    script: list[str] = field(default_factory=list, repr=False)
    roles: list[Entry] = field(default_factory=list)
    databases: list[Entry] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # what the script does, in words (no secret)

    @property
    def sql(self) -> str:
        return "".join(self.script)

    @property
    def problems(self) -> list[str]:
        return [f"role {e.name}: {e.reason}" for e in self.roles if not e.applied] + [
            f"database {e.name}: {e.reason}" for e in self.databases if not e.applied
        ]


def _epoch(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _valid_until_sql(value: datetime | None) -> str:
    if value is None:
        return "VALID UNTIL 'infinity'"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return "VALID UNTIL " + literal(value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S+00"))


def _attributes(role: Role) -> str:
    return " ".join(
        [
            "LOGIN" if role.login else "NOLOGIN",
            "CREATEDB" if role.createdb else "NOCREATEDB",
            "CREATEROLE" if role.createrole else "NOCREATEROLE",
            "INHERIT" if role.inherit else "NOINHERIT",
            "NOSUPERUSER NOREPLICATION NOBYPASSRLS",
            f"CONNECTION LIMIT {int(role.connection_limit)}",
            _valid_until_sql(role.valid_until),
        ]
    )


def _attributes_differ(role: Role, seen: ObservedRole) -> bool:
    return (
        (
            role.login,
            role.createdb,
            role.createrole,
            role.inherit,
            role.connection_limit,
            _epoch(role.valid_until),
        )
        != (seen.login, seen.createdb, seen.createrole, seen.inherit, seen.connection_limit, seen.valid_until)
        or seen.superuser
        or seen.replication
        or seen.bypassrls
    )


def _powers_of(role: ObservedRole | None) -> list[str]:
    """The superuser-power roles a membership in `role` would give: itself, if it is one, and what it
    reaches."""
    if role is None:
        return []
    own = [role.name] if role.superuser or role.name in UNSAFE_MEMBERSHIPS else []
    return sorted({*own, *role.reaches})


def _connect(db: str) -> str:
    return f"\\connect {_meta_name(db)}\n{QUIET_SQL}"


def converge(cluster: PostgresCluster, observed: Observed, pw: Passwords, *, salt: bytes | None = None
             ) -> Convergence:  # fmt: skip
    """The statements that bring the database to the spec, given what it holds; nothing when it matches."""
    out = Convergence()
    app_owner = cluster.spec.bootstrap.initdb.owner
    roles = declared_roles(cluster)
    dbs = declared_databases(cluster)
    declared_role_names = {r.name for r in roles}
    role_sql: list[str] = []
    grant_sql: list[str] = []

    for role in roles:
        reasons: list[str] = []
        seen = observed.roles.get(role.name)
        password = pw.by_role.get(role.name)
        if role.name in pw.problems:
            reasons.append(pw.problems[role.name])
        elif role.name in pw.waiting:
            reasons.append(f"waiting for Secret {role_secret_name(cluster, role.name)}")
        name = ident(role.name)
        if seen is None:
            secret = f" PASSWORD {literal(scram_sha256_verifier(password, salt=salt))}" if password else ""
            role_sql.append(f"CREATE ROLE {name} WITH {_attributes(role)}{secret};\n")
            role_sql.append(f"COMMENT ON ROLE {name} IS {literal(MARKER)};\n")
            out.changes.append(f"created role {role.name}")
        else:
            if _attributes_differ(role, seen):
                role_sql.append(f"ALTER ROLE {name} WITH {_attributes(role)};\n")
                out.changes.append(f"set the attributes of role {role.name}")
            if password and not verifier_matches(password, seen.verifier):
                role_sql.append(
                    f"ALTER ROLE {name} PASSWORD {literal(scram_sha256_verifier(password, salt=salt))};\n"
                )
                out.changes.append(f"set the password of role {role.name}")
            if not seen.managed:
                role_sql.append(f"COMMENT ON ROLE {name} IS {literal(MARKER)};\n")
        have = set() if seen is None else set(seen.member_of)
        refused = set()
        for target in role.in_roles:
            powers = _powers_of(observed.roles.get(target))
            if powers:
                # Admission refuses these roles by name; one that reaches them through others (a helper a
                # CREATEROLE role made, or one an administrator made) is refused here.
                reasons.append(f"membership in role {target}: refused, it reaches {', '.join(powers)} "
                               "(superuser power or the server's files)")  # fmt: skip
                refused.add(target)
                continue
            if target in have:
                continue
            if target not in observed.roles and target not in declared_role_names:
                reasons.append(f"membership in role {target}: no such role")
                continue
            grant_sql.append(f"GRANT {ident(target)} TO {name};\n")
            out.changes.append(f"granted {target} to {role.name}")
        admin_of = set() if seen is None else set(seen.admin_of)
        revocable = (have - set(role.in_roles) - admin_of) | (have & refused)
        for extra in sorted(revocable):
            grant_sql.append(f"REVOKE {ident(extra)} FROM {name};\n")
            out.changes.append(f"revoked {extra} from {role.name}")
        out.roles.append(Entry(role.name, not reasons, "; ".join(reasons)))

    db_sql: list[str] = []
    inside: list[str] = []
    for db in dbs:
        reasons = []
        seen_db = observed.databases.get(db.name)
        name = ident(db.name)
        if seen_db is None:
            options = [f"OWNER {ident(db.owner)}"]
            if db.encoding or db.locale:
                options.append("TEMPLATE template0")
            if db.encoding:
                options.append(f"ENCODING {literal(db.encoding)}")
            if db.locale:
                options.append(f"LOCALE {literal(db.locale)}")
            db_sql.append(f"CREATE DATABASE {name} {' '.join(options)};\n")
            db_sql.append(f"COMMENT ON DATABASE {name} IS {literal(MARKER)};\n")
            out.changes.append(f"created database {db.name}")
            have_ext: frozenset[str] = frozenset()
            have_schemas: Mapping[str, str] = {}
        else:
            if seen_db.owner != db.owner:
                db_sql.append(f"ALTER DATABASE {name} OWNER TO {ident(db.owner)};\n")
                out.changes.append(f"set the owner of database {db.name}")
            if not seen_db.managed:
                db_sql.append(f"COMMENT ON DATABASE {name} IS {literal(MARKER)};\n")
            if db.encoding and db.encoding.upper().replace("-", "") != seen_db.encoding.upper().replace(
                "-", ""
            ):
                reasons.append(f"exists with encoding {seen_db.encoding}; encoding applies only at creation")
            if db.locale and db.locale != seen_db.collate:
                reasons.append(f"exists with locale {seen_db.collate}; locale applies only at creation")
            if not seen_db.allow_connections:
                reasons.append("does not accept connections: extensions and schemas not applied")
                out.databases.append(Entry(db.name, False, "; ".join(reasons)))
                continue
            have_ext = seen_db.extensions or frozenset()
            have_schemas = seen_db.schemas or {}
        statements = []
        extension_schema = None if seen_db is None else seen_db.extension_schema_owner
        for ext in db.extensions:
            if ext in have_ext:
                continue
            if ext not in observed.available_extensions:
                reasons.append(f"extension {ext} is not available in the image")
                continue
            if ext in observed.trusted_extensions:
                # What the database's owner may do itself, done as the owner: the extension's script gets
                # no more than the tenant has.
                statements.append(
                    f"SET ROLE {ident(db.owner)};\n"
                    f"CREATE EXTENSION IF NOT EXISTS {ident(ext)} SCHEMA public;\n"
                    "SET ROLE NONE;\n"
                )
            else:
                if extension_schema is None:
                    # Created here, without IF NOT EXISTS: one the tenant made meanwhile fails the script.
                    statements.append(
                        f"CREATE SCHEMA {ident(EXTENSION_SCHEMA)} AUTHORIZATION CURRENT_USER;\n"
                        f"GRANT USAGE ON SCHEMA {ident(EXTENSION_SCHEMA)} TO PUBLIC;\n"
                    )
                    extension_schema = (SUPERUSER, True)
                elif not extension_schema[1]:
                    reasons.append(
                        f"extension {ext} is not trusted and goes into schema {EXTENSION_SCHEMA}, which is "
                        f"owned by {extension_schema[0]}, not a superuser: not created (drop or rename that "
                        "schema)"
                    )
                    continue
                statements.append(
                    f"CREATE EXTENSION IF NOT EXISTS {ident(ext)} SCHEMA {ident(EXTENSION_SCHEMA)};\n"
                )
            out.changes.append(f"created extension {ext} in {db.name}")
        for schema in db.schemas:
            owner = schema.owner or db.owner
            if schema.name not in have_schemas:
                statements.append(
                    f"CREATE SCHEMA IF NOT EXISTS {ident(schema.name)} AUTHORIZATION {ident(owner)};\n"
                )
                out.changes.append(f"created schema {schema.name} in {db.name}")
            elif have_schemas[schema.name] != owner:
                statements.append(f"ALTER SCHEMA {ident(schema.name)} OWNER TO {ident(owner)};\n")
                out.changes.append(f"set the owner of schema {schema.name} in {db.name}")
        if statements:
            inside += [_connect(db.name), *statements]
        out.databases.append(Entry(db.name, not reasons, "; ".join(reasons)))

    # Removed from the spec: what carries the marker but is no longer declared.
    policy = cluster.spec.removal_policy
    removal: list[str] = []
    declared_db_names = {d.name for d in dbs}
    dropped_dbs = set()
    for seen_db in sorted(observed.databases.values(), key=lambda d: d.name):
        if not seen_db.managed or seen_db.name in declared_db_names:
            continue
        if policy.databases == "delete":
            removal.append(f"DROP DATABASE IF EXISTS {ident(seen_db.name)} WITH (FORCE);\n")
            dropped_dbs.add(seen_db.name)
            out.changes.append(f"dropped database {seen_db.name} (removed from spec.databases)")
        else:
            removal.append(f"COMMENT ON DATABASE {ident(seen_db.name)} IS NULL;\n")
            out.changes.append(f"released database {seen_db.name} (removed from spec.databases; retained)")
    remaining = [d for d in observed.databases.values() if d.name not in dropped_dbs]
    # Databases psql can be pointed at by name (one created by hand with another name is left out: a role
    # owning objects there then fails to drop, and that is reported).
    connectable = sorted({d.name for d in remaining if d.allow_connections and _SAFE_NAME.fullmatch(d.name)}
                         | {"postgres"})  # fmt: skip
    drops: list[str] = []
    for seen in sorted(observed.roles.values(), key=lambda r: r.name):
        if not seen.managed or seen.name in declared_role_names or seen.name == app_owner:
            continue
        if policy.roles == "delete":
            owned = sorted(d.name for d in remaining if d.owner == seen.name)
            if owned:
                out.roles.append(
                    Entry(
                        seen.name,
                        False,
                        f"removed from spec.roles but kept: it owns database "
                        f"{', '.join(owned)}; change their owner or remove them",
                    )
                )
                continue
            for db_name in connectable:
                drops += [
                    _connect(db_name),
                    f"REASSIGN OWNED BY {ident(seen.name)} TO {ident(app_owner)};\n",
                    f"DROP OWNED BY {ident(seen.name)};\n",
                ]
            drops += [_connect("postgres"), f"DROP ROLE IF EXISTS {ident(seen.name)};\n"]
            out.changes.append(f"dropped role {seen.name} (removed from spec.roles)")
        else:
            removal.append(f"COMMENT ON ROLE {ident(seen.name)} IS NULL;\n")
            out.changes.append(f"released role {seen.name} (removed from spec.roles; retained)")

    body = role_sql + grant_sql + db_sql + removal
    if body or inside or drops:
        out.script = [QUIET_SQL, *body, *inside, *drops]
    return out


def without_secrets(text: str) -> str:
    """psql's output, for a message: any line that could quote a verifier is left out."""
    return "\n".join(line for line in text.splitlines() if "SCRAM-SHA-256$" not in line).strip()


# --- status ---------------------------------------------------------------------------------------------

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
