"""The read-only psql script that shows what the database holds of the declared roles and databases, and
its output read back into typed values. Pure: no I/O.

It runs as the superuser over the instance's Unix socket, in databases a tenant owns: the session is
pinned (privileged_sql.py) at the start and after each `\\connect`, and every function and table it reads
is named with its schema, so nothing a tenant planted is ever resolved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.roles import UNSAFE_MEMBERSHIPS
from pg_operator.privileged_sql import QUIET_SQL
from pg_operator.specs.roles import (
    EXTENSION_SCHEMA,
    MARKER,
    declared_databases,
    declared_roles,
    literal,
    meta_name,
    text_array,
)


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
    powerful = text_array(UNSAFE_MEMBERSHIPS)
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
    declared = text_array([r.name for r in declared_roles(cluster)])
    referenced = text_array(_referenced_roles(cluster))
    requested = text_array(sorted({e for d in declared_databases(cluster) for e in d.extensions}))
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
        schemas = text_array([s.name for s in db.schemas])
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
            f"\\connect {meta_name(db.name)}",
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
