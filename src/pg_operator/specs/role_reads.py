"""The read-only psql script that shows what the database holds of the declared roles and databases, and
its output read back into typed values. Pure: no I/O.

One psql over the instance's Unix socket, in two parts:
- as the superuser, in `postgres` (which no tenant owns): roles with the verifiers of the declared ones
  (only `pg_authid` holds them, and only a superuser may read it), databases, available extensions, and
  which declared databases the read role may enter;
- inside each declared database, which a tenant owns: as `READ_ROLE` (the monitoring role, admitted to
  every database over the socket by its own peer map), never the superuser. What it reads there
  (extensions, schemas and their owners, the owner of the extension schema) any role may read.
A database the read role may not enter (its owner revoked CONNECT from PUBLIC, or allows no connections)
is reported as not read, naming it, and nothing is planned inside it; it is never read as the superuser
instead. An instance whose pg_hba does not admit the read role there yet (an image from before this
change, until its pod is rolled) is read as before: as the superuser, and the result says so
(`Observed.databases_read_as`). Which of the two is decided by the server's own pg_hba as it is on disk
(`pg_hba_file_rules`), which no tenant can write.

Every session is pinned (privileged_sql.py) at the start and after each `\\connect`, and every function
and table read is named with its schema, so nothing a tenant planted is ever resolved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.api.roles import UNSAFE_MEMBERSHIPS
from pg_operator.privileged_sql import QUIET_SQL, READ_SQL
from pg_operator.specs.roles import (
    EXTENSION_SCHEMA,
    MARKER,
    declared_databases,
    declared_roles,
    literal,
    meta_name,
    text_array,
)

# The role that reads inside the declared databases: the instance's monitoring role (session_roles.py), which
# logs in only over the socket through its own peer map. What it reads there is readable by any role; it
# holds pg_monitor besides, which adds nothing it could not already read from `postgres`.
READ_ROLE = MONITOR_ROLE


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
    # Declared, accepting connections, but not read: why (the read role may not enter it, or the read
    # stopped there). Nothing is known of its inside, so nothing is planned there.
    unread: str | None = None


@dataclass(frozen=True)
class Observed:
    roles: Mapping[str, ObservedRole]
    databases: Mapping[str, ObservedDatabase]
    available_extensions: frozenset[str]
    # Of the available ones, those a database owner may create itself (`trusted` in their control file).
    trusted_extensions: frozenset[str] = frozenset()
    # The role the declared databases were read as: READ_ROLE, or the superuser where the instance's
    # pg_hba does not admit READ_ROLE to them (an older image), which the sub-reconciler logs.
    databases_read_as: str = READ_ROLE
    # The database where the read stopped (the read role was refused there): those after it were not read.
    stopped_at: str | None = None


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


def _admitted() -> str:
    """Whether the instance's pg_hba (as on disk: Patroni writes it and reloads at once) lets READ_ROLE
    into every database over the socket. pg_hba_file_rules is readable by the superuser only."""
    return (
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_hba_file_rules h WHERE h.type = 'local' "  # noqa: S608
        "AND h.error IS NULL AND h.auth_method = 'peer' AND 'all' = ANY (h.database) "
        f"AND {literal(READ_ROLE)} = ANY (h.user_name)) AS pgop_admitted \\gset"
    )


def _entry_plan(names: list[str]) -> str:
    """Per declared database that exists: whether it is read, and why not (NULL: it is read, or it does not
    accept connections, which the databases part says). Depends on `pgop_admitted`: without it the
    databases are read as the superuser, as before, and only `datallowconn` counts."""
    role = literal(READ_ROLE)
    missing = literal(f"role {READ_ROLE}, which reads the declared databases, is missing or cannot log in")
    revoked = literal(f"{READ_ROLE} may not connect to it: CONNECT is granted neither to it nor to PUBLIC")
    closed = literal(f"{READ_ROLE} may not connect to it: it allows no connections, CONNECTION LIMIT 0")
    reason = (
        "CASE WHEN NOT :'pgop_admitted'::pg_catalog.bool OR NOT d.datallowconn THEN NULL "  # noqa: S608
        f"WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = {role} AND r.rolcanlogin) "
        f"THEN {missing} WHEN NOT pg_catalog.has_database_privilege({role}, d.oid, 'CONNECT') THEN {revoked} "
        f"WHEN d.datconnlimit = 0 THEN {closed} END"
    )
    names_array = text_array(names)
    return (
        "SELECT d.datname AS name, "  # noqa: S608
        f"pg_catalog.array_position({names_array}, d.datname::pg_catalog.text) AS at, {reason} AS reason, "
        f"d.datallowconn AS allowed FROM pg_catalog.pg_database d WHERE d.datname = ANY({names_array})"
    )


def read_order(cluster: PostgresCluster, read_last: Collection[str] = ()) -> list[str]:
    """The declared databases in the order they are read: as declared, those not read last time at the
    end, so a database that refuses the read role cannot keep the others from being read."""
    names = [d.name for d in declared_databases(cluster)]
    return [n for n in names if n not in read_last] + [n for n in names if n in read_last]


def observe_sql(cluster: PostgresCluster, read_last: Collection[str] = ()) -> str:
    """A psql script (run as the superuser over the socket, -AtX, in a pinned session: privileged_sql)
    printing one JSON line per part: the referenced and managed roles (with the verifiers of the declared
    ones and the superuser-power roles each reaches), every database, the available extensions (and which
    are trusted), which declared databases are read and as whom; then, inside each declared database that
    is read, as READ_ROLE (or as the superuser on an instance whose pg_hba does not admit it), its
    extensions, declared schemas and the owner of the schema untrusted extensions go into. Read-only.
    Every function and table is named with its schema; the session is pinned again after each
    `\\connect`, since a tenant owns these databases and may set their search path."""
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
    order = read_order(cluster, read_last)
    plan = _entry_plan(order)
    reads_part = (
        "SELECT pg_catalog.json_build_object('part', 'reads', 'as', CASE WHEN "  # noqa: S608
        f":'pgop_admitted'::pg_catalog.bool THEN {literal(READ_ROLE)} ELSE session_user END, 'databases', "
        "(SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object('name', p.name, "
        "'read', p.allowed AND p.reason IS NULL, 'reason', p.reason) ORDER BY p.at), '[]'::pg_catalog.json) "
        f"FROM ({plan}) p));"
    )
    lines = [QUIET_SQL, roles_part, databases_part, extensions_part, _admitted(), reads_part]
    for at, name in enumerate(order):
        lines.append(
            f"SELECT EXISTS (SELECT 1 FROM ({plan}) p WHERE p.name = {literal(name)} "  # noqa: S608
            f"AND p.allowed AND p.reason IS NULL) AS pgop_read_{at} \\gset"
        )
    for at, name in enumerate(order):
        db = next(d for d in declared_databases(cluster) if d.name == name)
        schemas = text_array([s.name for s in db.schemas])
        # pg_roles, not pg_authid: the read role may not read the latter, and needs no verifier here.
        detail = (
            "SELECT pg_catalog.json_build_object('part', 'database', "  # noqa: S608
            "'name', pg_catalog.current_database(), 'readAs', session_user, "
            "'extensions', (SELECT coalesce(pg_catalog.json_agg(extname ORDER BY extname), "
            "'[]'::pg_catalog.json) "
            "FROM pg_catalog.pg_extension), "
            "'schemas', (SELECT coalesce(pg_catalog.json_object_agg(nspname, "
            "pg_catalog.pg_get_userbyid(nspowner)), '{}'::pg_catalog.json) "
            f"FROM pg_catalog.pg_namespace WHERE nspname = ANY({schemas})), "
            "'extensionSchema', (SELECT pg_catalog.json_build_array(o.rolname, o.rolsuper) "
            "FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner "
            f"WHERE n.nspname = {literal(EXTENSION_SCHEMA)}));"
        )
        lines += [
            f"\\if :pgop_read_{at}",
            "\\if :pgop_admitted",
            # A new connection as the read role (host and port as before); the superuser's is closed and
            # never comes back. If it is refused, psql stops here: the databases after it are not read.
            f"\\connect {meta_name(name)} {READ_ROLE}",
            READ_SQL,
            "\\else",
            f"\\connect {meta_name(name)}",
            QUIET_SQL,
            "\\endif",
            detail,
            "\\endif",
        ]
    return "\n".join(lines) + "\n"


class ObservationError(ValueError):
    """The observe script's output could not be read (its text is never quoted: it holds verifiers)."""


# A connection psql could not open, as it reports it (`… failed: FATAL:  permission denied for database
# "x"`), or a statement's error: the server's words, which name no secret of this script.
_REFUSAL = re.compile(r"(?:FATAL|ERROR):\s+(.+)")


def parse_observed(stdout: str, stderr: str = "") -> Observed:
    """The script's output (stdout) read back; `stderr` says why the read stopped where it did, if it
    stopped (psql ends at a refused `\\connect`)."""
    roles: dict[str, ObservedRole] = {}
    databases: dict[str, ObservedDatabase] = {}
    details: dict[str, dict[str, Any]] = {}
    reads: dict[str, Any] | None = None
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
                roles.update((r["name"], _role(r)) for r in part["items"])
            elif kind == "databases":
                databases.update((d["name"], _database(d)) for d in part["items"])
            elif kind == "extensions":
                available = frozenset(part["available"] or ())
                trusted = frozenset(part.get("trusted") or ())
            elif kind == "reads":
                reads = {"as": str(part["as"]), "databases": [
                    (str(d["name"]), bool(d["read"]), d.get("reason")) for d in part["databases"] or ()
                ]}  # fmt: skip
            elif kind == "database":
                details[part["name"]] = part
            seen.add(kind)
        except (ValueError, KeyError, TypeError) as exc:
            raise ObservationError(f"unreadable output of the roles query ({type(exc).__name__})") from None
    if not {"roles", "databases", "extensions", "reads"} <= seen or available is None or reads is None:
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
    stopped_at = _mark_unread(databases, details, reads, stderr)
    return Observed(
        roles, databases, available, trusted, databases_read_as=reads["as"], stopped_at=stopped_at
    )


def _role(r: Mapping[str, Any]) -> ObservedRole:
    return ObservedRole(
        name=r["name"], login=bool(r["login"]), createdb=bool(r["createdb"]),
        createrole=bool(r["createrole"]), inherit=bool(r["inherit"]),
        superuser=bool(r["superuser"]), replication=bool(r["replication"]),
        bypassrls=bool(r["bypassrls"]), connection_limit=int(r["connectionLimit"]),
        valid_until=None if r["validUntil"] is None else int(r["validUntil"]),
        managed=bool(r["managed"]), member_of=frozenset(r["memberOf"] or ()),
        admin_of=frozenset(r.get("adminOf") or ()), verifier=r.get("verifier"),
        reaches=frozenset(r.get("reaches") or ()),
    )  # fmt: skip


def _database(d: Mapping[str, Any]) -> ObservedDatabase:
    return ObservedDatabase(
        name=d["name"], owner=d["owner"], encoding=d["encoding"], collate=d["collate"],
        allow_connections=bool(d["allowConnections"]), managed=bool(d["managed"]),
    )  # fmt: skip


def _mark_unread(databases: dict[str, ObservedDatabase], details: Mapping[str, Any], reads: Mapping[str, Any],
                 stderr: str) -> str | None:  # fmt: skip
    """Mark each declared database whose inside was not read with why; the one the read stopped at."""
    stopped_at = None
    for name, read, reason in reads["databases"]:
        if name not in databases or name in details:
            continue
        if reason is None and read:
            if stopped_at is None:
                stopped_at = name
                refusal = _REFUSAL.search(stderr)
                why = refusal.group(1).strip() if refusal else "psql stopped"
                reason = f"{reads['as']} could not read it: {why}"
            else:
                reason = f"not read this time: the read stopped at database {stopped_at}"
        if reason is not None:
            databases[name] = ObservedDatabase(**{**databases[name].__dict__, "unread": str(reason)[:300]})
    return stopped_at


def observed_of(exit_status: int, stdout: str, stderr: str) -> Observed | None:
    """The script's result as the sub-reconciler takes it. psql ends where the read role is refused: what
    it read before counts (that database is reported, those after it read next time). None: the script
    failed otherwise (psql's stderr says why); ObservationError: it succeeded but its output is unreadable.
    """
    try:
        observed = parse_observed(stdout, stderr)
    except ObservationError:
        if exit_status == 0:
            raise
        return None
    if exit_status != 0 and observed.stopped_at is None:
        return None
    return observed


def _owner_of(value: Any) -> tuple[str, bool] | None:
    if value is None:
        return None
    owner, superuser = value
    return str(owner), bool(superuser)
