"""The statements that bring the database to the declared roles and databases, given what it holds
(role_reads.py); nothing when it matches. Pure: no I/O.

Trusted extensions are created as the database's owner, untrusted ones by the superuser in a schema no
tenant can write (`EXTENSION_SCHEMA`); a membership that reaches superuser power is refused and revoked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import SUPERUSER
from pg_operator.api.roles import UNSAFE_MEMBERSHIPS, Database, Role
from pg_operator.privileged_sql import QUIET_SQL
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs.role_reads import Observed, ObservedDatabase, ObservedRole
from pg_operator.specs.roles import (
    EXTENSION_SCHEMA,
    MARKER,
    SAFE_NAME,
    Entry,
    Passwords,
    declared_databases,
    declared_roles,
    ident,
    literal,
    meta_name,
    role_secret_name,
    verifier_matches,
)


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
    return f"\\connect {meta_name(db)}\n{QUIET_SQL}"


def converge(cluster: PostgresCluster, observed: Observed, pw: Passwords, *, salt: bytes | None = None
             ) -> Convergence:  # fmt: skip
    """The statements that bring the database to the spec, given what it holds; nothing when it matches."""
    out = Convergence()
    roles = declared_roles(cluster)
    declared_role_names = {r.name for r in roles}
    role_sql: list[str] = []
    grant_sql: list[str] = []
    for role in roles:
        reasons = _password_reasons(cluster, role, pw)
        role_sql += _role_statements(
            role, observed.roles.get(role.name), pw.by_role.get(role.name), salt, out
        )
        grant_sql += _memberships(role, observed, declared_role_names, reasons, out)
        out.roles.append(Entry(role.name, not reasons, "; ".join(reasons)))

    db_sql: list[str] = []
    inside: list[str] = []
    dbs = declared_databases(cluster)
    for db in dbs:
        created, statements = _database(db, observed, out)
        db_sql += created
        if statements:
            inside += [_connect(db.name), *statements]

    # Removed from the spec: what carries the marker but is no longer declared.
    removal, remaining = _removed_databases(cluster, observed, {d.name for d in dbs}, out)
    released, drops = _removed_roles(cluster, observed, declared_role_names, remaining, out)
    body = role_sql + grant_sql + db_sql + removal + released
    if body or inside or drops:
        out.script = [QUIET_SQL, *body, *inside, *drops]
    return out


def _password_reasons(cluster: PostgresCluster, role: Role, pw: Passwords) -> list[str]:
    if role.name in pw.problems:
        return [pw.problems[role.name]]
    if role.name in pw.waiting:
        return [f"waiting for Secret {role_secret_name(cluster, role.name)}"]
    return []


def _role_statements(role: Role, seen: ObservedRole | None, password: str | None, salt: bytes | None,
                     out: Convergence) -> list[str]:  # fmt: skip
    """CREATE or ALTER of the role itself: attributes, password, the operator's marker."""
    name = ident(role.name)
    if seen is None:
        secret = f" PASSWORD {literal(scram_sha256_verifier(password, salt=salt))}" if password else ""
        out.changes.append(f"created role {role.name}")
        return [f"CREATE ROLE {name} WITH {_attributes(role)}{secret};\n",
                f"COMMENT ON ROLE {name} IS {literal(MARKER)};\n"]  # fmt: skip
    sql = []
    if _attributes_differ(role, seen):
        sql.append(f"ALTER ROLE {name} WITH {_attributes(role)};\n")
        out.changes.append(f"set the attributes of role {role.name}")
    if password and not verifier_matches(password, seen.verifier):
        sql.append(f"ALTER ROLE {name} PASSWORD {literal(scram_sha256_verifier(password, salt=salt))};\n")
        out.changes.append(f"set the password of role {role.name}")
    if not seen.managed:
        sql.append(f"COMMENT ON ROLE {name} IS {literal(MARKER)};\n")
    return sql


def _memberships(role: Role, observed: Observed, declared_role_names: set[str], reasons: list[str],
                 out: Convergence) -> list[str]:  # fmt: skip
    """GRANT and REVOKE so the role is a member of what it declares, and of nothing that gives superuser
    power; what cannot be granted is added to `reasons`."""
    seen = observed.roles.get(role.name)
    name = ident(role.name)
    have = set() if seen is None else set(seen.member_of)
    refused = set()
    sql = []
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
        sql.append(f"GRANT {ident(target)} TO {name};\n")
        out.changes.append(f"granted {target} to {role.name}")
    admin_of = set() if seen is None else set(seen.admin_of)
    revocable = (have - set(role.in_roles) - admin_of) | (have & refused)
    for extra in sorted(revocable):
        sql.append(f"REVOKE {ident(extra)} FROM {name};\n")
        out.changes.append(f"revoked {extra} from {role.name}")
    return sql


def _database(db: Database, observed: Observed, out: Convergence) -> tuple[list[str], list[str]]:
    """(statements on the database itself, statements run inside it) and its status entry."""
    reasons: list[str] = []
    seen_db = observed.databases.get(db.name)
    if seen_db is None:
        db_sql = _create_database(db)
        out.changes.append(f"created database {db.name}")
        have_ext: frozenset[str] = frozenset()
        have_schemas: Mapping[str, str] = {}
    else:
        db_sql = _existing_database(db, seen_db, reasons, out)
        if not seen_db.allow_connections:
            reasons.append("does not accept connections: extensions and schemas not applied")
            out.databases.append(Entry(db.name, False, "; ".join(reasons)))
            return db_sql, []
        if seen_db.unread is not None:
            # Its inside is unknown: nothing is planned there (never read or written blind).
            reasons.append(f"not read: {seen_db.unread}; extensions and schemas not applied")
            out.databases.append(Entry(db.name, False, "; ".join(reasons)))
            return db_sql, []
        have_ext = seen_db.extensions or frozenset()
        have_schemas = seen_db.schemas or {}
    extension_schema = None if seen_db is None else seen_db.extension_schema_owner
    statements = _extensions(db, observed, have_ext, extension_schema, reasons, out)
    statements += _schemas(db, have_schemas, out)
    out.databases.append(Entry(db.name, not reasons, "; ".join(reasons)))
    return db_sql, statements


def _create_database(db: Database) -> list[str]:
    name = ident(db.name)
    options = [f"OWNER {ident(db.owner)}"]
    if db.encoding or db.locale:
        options.append("TEMPLATE template0")
    if db.encoding:
        options.append(f"ENCODING {literal(db.encoding)}")
    if db.locale:
        options.append(f"LOCALE {literal(db.locale)}")
    return [
        f"CREATE DATABASE {name} {' '.join(options)};\n",
        f"COMMENT ON DATABASE {name} IS {literal(MARKER)};\n",
    ]


def _existing_database(
    db: Database, seen_db: ObservedDatabase, reasons: list[str], out: Convergence
) -> list[str]:
    """The owner and the marker of a database that exists; what only applies at creation is a reason."""
    name = ident(db.name)
    sql = []
    if seen_db.owner != db.owner:
        sql.append(f"ALTER DATABASE {name} OWNER TO {ident(db.owner)};\n")
        out.changes.append(f"set the owner of database {db.name}")
    if not seen_db.managed:
        sql.append(f"COMMENT ON DATABASE {name} IS {literal(MARKER)};\n")
    if db.encoding and db.encoding.upper().replace("-", "") != seen_db.encoding.upper().replace("-", ""):
        reasons.append(f"exists with encoding {seen_db.encoding}; encoding applies only at creation")
    if db.locale and db.locale != seen_db.collate:
        reasons.append(f"exists with locale {seen_db.collate}; locale applies only at creation")
    return sql


def _extensions(
    db: Database,
    observed: Observed,
    have: frozenset[str],
    extension_schema: tuple[str, bool] | None,
    reasons: list[str],
    out: Convergence,
) -> list[str]:
    """CREATE EXTENSION for what the database lacks: a trusted one as the database's owner, any other
    by the superuser into EXTENSION_SCHEMA (created here, or owned by a superuser)."""
    statements = []
    for ext in db.extensions:
        if ext in have:
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
    return statements


def _schemas(db: Database, have: Mapping[str, str], out: Convergence) -> list[str]:
    statements = []
    for schema in db.schemas:
        owner = schema.owner or db.owner
        if schema.name not in have:
            statements.append(
                f"CREATE SCHEMA IF NOT EXISTS {ident(schema.name)} AUTHORIZATION {ident(owner)};\n"
            )
            out.changes.append(f"created schema {schema.name} in {db.name}")
        elif have[schema.name] != owner:
            statements.append(f"ALTER SCHEMA {ident(schema.name)} OWNER TO {ident(owner)};\n")
            out.changes.append(f"set the owner of schema {schema.name} in {db.name}")
    return statements


def _removed_databases(cluster: PostgresCluster, observed: Observed, declared: set[str], out: Convergence
                       ) -> tuple[list[str], list[ObservedDatabase]]:  # fmt: skip
    """Dropped or released (the marker taken off) per the removal policy; and the databases left."""
    sql = []
    dropped = set()
    for seen_db in sorted(observed.databases.values(), key=lambda d: d.name):
        if not seen_db.managed or seen_db.name in declared:
            continue
        if cluster.spec.removal_policy.databases == "delete":
            sql.append(f"DROP DATABASE IF EXISTS {ident(seen_db.name)} WITH (FORCE);\n")
            dropped.add(seen_db.name)
            out.changes.append(f"dropped database {seen_db.name} (removed from spec.databases)")
        else:
            sql.append(f"COMMENT ON DATABASE {ident(seen_db.name)} IS NULL;\n")
            out.changes.append(f"released database {seen_db.name} (removed from spec.databases; retained)")
    return sql, [d for d in observed.databases.values() if d.name not in dropped]


def _removed_roles(
    cluster: PostgresCluster,
    observed: Observed,
    declared: set[str],
    remaining: list[ObservedDatabase],
    out: Convergence,
) -> tuple[list[str], list[str]]:
    """(statements releasing roles, statements dropping them) per the removal policy; a role that still
    owns a database is kept and reported."""
    app_owner = cluster.spec.bootstrap.initdb.owner
    # Databases psql can be pointed at by name (one created by hand with another name is left out: a role
    # owning objects there then fails to drop, and that is reported).
    connectable = sorted({d.name for d in remaining if d.allow_connections and SAFE_NAME.fullmatch(d.name)}
                         | {"postgres"})  # fmt: skip
    released: list[str] = []
    drops: list[str] = []
    for seen in sorted(observed.roles.values(), key=lambda r: r.name):
        if not seen.managed or seen.name in declared or seen.name == app_owner:
            continue
        if cluster.spec.removal_policy.roles != "delete":
            released.append(f"COMMENT ON ROLE {ident(seen.name)} IS NULL;\n")
            out.changes.append(f"released role {seen.name} (removed from spec.roles; retained)")
            continue
        owned = sorted(d.name for d in remaining if d.owner == seen.name)
        if owned:
            out.roles.append(Entry(seen.name, False, f"removed from spec.roles but kept: it owns database "
                                   f"{', '.join(owned)}; change their owner or remove them"))  # fmt: skip
            continue
        for db_name in connectable:
            drops += [
                _connect(db_name),
                f"REASSIGN OWNED BY {ident(seen.name)} TO {ident(app_owner)};\n",
                f"DROP OWNED BY {ident(seen.name)};\n",
            ]
        drops += [_connect("postgres"), f"DROP ROLE IF EXISTS {ident(seen.name)};\n"]
        out.changes.append(f"dropped role {seen.name} (removed from spec.roles)")
    return released, drops


def without_secrets(text: str) -> str:
    """psql's output, for a message: any line that could quote a verifier is left out."""
    return "\n".join(line for line in text.splitlines() if "SCRAM-SHA-256$" not in line).strip()
