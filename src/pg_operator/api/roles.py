"""Types of `spec.roles`, `spec.databases` and what happens to an entry removed from them.

Each role and database the user declares is converged by the roles sub-reconciler
(controller/reconcilers/roles.py) from the SQL that specs/role_reads.py and specs/role_changes.py plan.
Everything the API server can judge is refused at admission, naming the field: reserved and system names, the
operator's own roles, superuser and replication roles (not representable at all: least privilege — a declared
role never gets SUPERUSER, REPLICATION or BYPASSRLS, and the operator puts those back to off when they are set
by hand), duplicates (list-type map keyed by name), a database or schema owner that is neither declared nor
the application owner, and a database's encoding or locale changed after it was declared (applied at creation
only). What only the database can refuse (an extension the image lacks, membership in a role that does not
exist) is reported in the status, never admitted as applied.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from pg_operator.api.constants import MONITOR_ROLE, PATRONI_API_USER, REPLICATION_USER, SUPERUSER
from pg_operator.api.schema import SpecModel, rule, validations

MAX_ROLES = 32
MAX_DATABASES = 32
MAX_MEMBERSHIPS = 16
MAX_EXTENSIONS = 16
MAX_SCHEMAS = 16

# A declared role's name: an unquoted identifier that also yields a valid Secret name `<cluster>-<name>`
# with '_' written '-' (so it must end with a letter or digit).
ROLE_NAME_PATTERN = r"^[a-z]([a-z0-9_]{0,61}[a-z0-9])?$"
# Databases and schemas: unquoted identifiers.
OBJECT_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
# Roles a membership may name: identifiers, including PostgreSQL's predefined pg_* roles.
MEMBERSHIP_PATTERN = OBJECT_NAME_PATTERN
# Extension names as PostgreSQL's contrib spells them (uuid-ossp has a hyphen).
EXTENSION_PATTERN = r"^[a-z_][a-z0-9_-]{0,62}$"
ENCODING_PATTERN = r"^[A-Za-z0-9_]{1,32}$"
LOCALE_PATTERN = r"^[A-Za-z0-9_.@-]{1,64}$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # noqa: S105
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"  # noqa: S105

# Names PostgreSQL gives a meaning of its own in role positions: no role may be created under them.
SPECIAL_ROLE_NAMES: tuple[str, ...] = ("public", "none", "current_role", "current_user", "session_user",
                                       "user", "all")  # fmt: skip
# Roles a declared role may not be, nor be a member of: the operator's own and PostgreSQL's special names.
RESERVED_ROLE_NAMES: tuple[str, ...] = (SUPERUSER, REPLICATION_USER, MONITOR_ROLE, PATRONI_API_USER,
                                        *SPECIAL_ROLE_NAMES)  # fmt: skip
# Predefined roles that read or write the server's files or run programs as its OS user: a member could
# read the operator's Secrets from the data directory's neighbours. Refused as memberships.
UNSAFE_MEMBERSHIPS: tuple[str, ...] = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
)
RESERVED_DATABASE_NAMES: tuple[str, ...] = ("postgres", "template0", "template1")
# Suffixes of the operator's own Secrets `<cluster>-<suffix>` (specs/names.py): a generated role Secret
# must not take one of their names.
OPERATOR_SECRET_SUFFIXES: tuple[str, ...] = (
    "app",
    "superuser",
    "replication",
    "patroni-api",
    "ca",
    "server-tls",
)
_COLLIDING_ROLE_NAMES: tuple[str, ...] = tuple(s.replace("-", "_") for s in OPERATOR_SECRET_SUFFIXES)

RemovalPolicy = Literal["retain", "delete"]


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def secret_suffix(role: str) -> str:
    """The generated Secret of role `role` is `<cluster>-<secret_suffix(role)>`."""
    return role.replace("_", "-")


_ROLE_NAME_MESSAGE = (
    f"must not start with pg_ or be one of {', '.join(RESERVED_ROLE_NAMES)} (the operator's and "
    "PostgreSQL's own roles)"
)
_MEMBERSHIP_MESSAGE = (
    f"must not name {', '.join(RESERVED_ROLE_NAMES)} or {', '.join(UNSAFE_MEMBERSHIPS)} (superuser power or "
    "the server's files)"
)
_SECRET_COLLISION_MESSAGE = (
    "a login role without passwordSecret gets Secret <cluster>-<name>, which would be one of the operator's "
    f"own ({', '.join(OPERATOR_SECRET_SUFFIXES)}): rename the role or name a passwordSecret"
)

RoleName = Annotated[str, StringConstraints(pattern=ROLE_NAME_PATTERN, min_length=1, max_length=63)]
ObjectName = Annotated[str, StringConstraints(pattern=OBJECT_NAME_PATTERN, min_length=1, max_length=63)]
Membership = Annotated[
    str,
    StringConstraints(pattern=MEMBERSHIP_PATTERN, min_length=1, max_length=63),
    Field(
        json_schema_extra=validations(
            rule(f"!(self in {_cel_list(RESERVED_ROLE_NAMES + UNSAFE_MEMBERSHIPS)})", _MEMBERSHIP_MESSAGE)
        )
    ),
]
Extension = Annotated[str, StringConstraints(pattern=EXTENSION_PATTERN, min_length=1, max_length=63)]


class PasswordSecret(SpecModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description="A Secret in the cluster's namespace, labelled db.example.com/cluster=<cluster> (the "
        "operator watches only Secrets so labelled). Read, never written.",
    )
    key: str = Field(
        "password",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="The key holding the password.",
    )


class Role(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                f"!(self.name in {_cel_list(RESERVED_ROLE_NAMES)}) && !self.name.startsWith('pg_')",
                f"name {_ROLE_NAME_MESSAGE}",
                fieldPath=".name",
            ),
            rule(
                "!self.login || has(self.passwordSecret) || "
                f"!(self.name in {_cel_list(_COLLIDING_ROLE_NAMES)})",
                _SECRET_COLLISION_MESSAGE,
                fieldPath=".name",
            ),
            rule(
                "!has(self.inRoles) || !(self.name in self.inRoles)",
                "inRoles must not name the role itself",
                fieldPath=".inRoles",
            ),
        )
    )

    name: RoleName = Field(description="The role's name (lower case; may not end with '_').")
    login: bool = Field(
        True,
        description="May log in. A login role without passwordSecret gets a generated "
        "password in Secret <cluster>-<name> ('_' written '-').",
    )
    createdb: bool = Field(False, description="May create databases.")
    createrole: bool = Field(False, description="May create roles.")
    inherit: bool = Field(True, description="Uses the privileges of the roles it is a member of.")
    connection_limit: int = Field(-1, ge=-1, le=100000, description="Concurrent connections; -1: no limit.")
    valid_until: datetime | None = Field(
        None,
        description="When its password stops being accepted (RFC 3339); unset: never.",
    )
    in_roles: list[Membership] = Field(
        default_factory=list,
        max_length=MAX_MEMBERSHIPS,
        description="Roles it is a member of (declared roles, or others such as pg_read_all_data). One "
        "missing from the database is reported, not created.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    password_secret: PasswordSecret | None = Field(
        None,
        description="Take the password from this Secret, which the user manages (rotate it there).",
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_ROLE_NAMES or name.startswith("pg_"):
            raise ValueError(f"name {_ROLE_NAME_MESSAGE}")
        return name

    @field_validator("in_roles")
    @classmethod
    def _memberships(cls, in_roles: list[str]) -> list[str]:
        bad = [r for r in in_roles if r in RESERVED_ROLE_NAMES + UNSAFE_MEMBERSHIPS]
        if bad:
            raise ValueError(f"inRoles: {', '.join(bad)} {_MEMBERSHIP_MESSAGE}")
        if len(set(in_roles)) != len(in_roles):
            raise ValueError("inRoles: duplicate entries")
        return in_roles

    @model_validator(mode="after")
    def _consistent(self) -> Role:
        if self.login and self.password_secret is None and self.name in _COLLIDING_ROLE_NAMES:
            raise ValueError(f"name: {_SECRET_COLLISION_MESSAGE}")
        if self.name in self.in_roles:
            raise ValueError("inRoles must not name the role itself")
        return self


class Schema(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!self.name.startsWith('pg_') && !(self.name in ['public', 'information_schema'])",
                "name must not start with pg_ or be public or information_schema",
                fieldPath=".name",
            ),
        )
    )

    name: ObjectName = Field(description="The schema's name.")
    owner: ObjectName | None = Field(None, description="Its owner; unset: the database's owner.")

    @field_validator("name")
    @classmethod
    def _not_system(cls, name: str) -> str:
        if name.startswith("pg_") or name in ("public", "information_schema"):
            raise ValueError("name must not start with pg_ or be public or information_schema")
        return name


class Database(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                f"!(self.name in {_cel_list(RESERVED_DATABASE_NAMES)})",
                f"name must not be one of {', '.join(RESERVED_DATABASE_NAMES)}",
                fieldPath=".name",
            ),
            rule(
                "has(self.encoding) == has(oldSelf.encoding) && (!has(self.encoding) || self.encoding == "
                "oldSelf.encoding)",
                "encoding is applied when the database is created and cannot change",
                fieldPath=".encoding",
                reason="FieldValueForbidden",
            ),
            rule(
                "has(self.locale) == has(oldSelf.locale) && "
                "(!has(self.locale) || self.locale == oldSelf.locale)",
                "locale is applied when the database is created and cannot change",
                fieldPath=".locale",
                reason="FieldValueForbidden",
            ),
        )
    )

    name: ObjectName = Field(description="The database's name.")
    owner: ObjectName = Field(
        description="Its owner: a role in spec.roles, or the application owner (spec.bootstrap.initdb.owner)."
    )
    encoding: str | None = Field(
        None,
        pattern=ENCODING_PATTERN,
        max_length=32,
        description="Encoding at creation (e.g. UTF8); immutable.",
    )
    locale: str | None = Field(
        None,
        pattern=LOCALE_PATTERN,
        max_length=64,
        description="LC_COLLATE and LC_CTYPE at creation (e.g. C.UTF-8); immutable.",
    )
    extensions: list[Extension] = Field(
        default_factory=list,
        max_length=MAX_EXTENSIONS,
        description="CREATE EXTENSION IF NOT EXISTS in this database; one the image does not ship is "
        "reported. Removing one from the list does not drop it.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    schemas: list[Schema] = Field(
        default_factory=list,
        max_length=MAX_SCHEMAS,
        description="Schemas created in this database, and their owners kept. Removing one does not drop it.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_DATABASE_NAMES:
            raise ValueError(f"name must not be one of {', '.join(RESERVED_DATABASE_NAMES)}")
        return name

    @field_validator("schemas")
    @classmethod
    def _unique_schemas(cls, schemas: list[Schema]) -> list[Schema]:
        if len({s.name for s in schemas}) != len(schemas):
            raise ValueError("schemas: duplicate names")
        return schemas

    @field_validator("extensions")
    @classmethod
    def _unique_extensions(cls, extensions: list[str]) -> list[str]:
        if len(set(extensions)) != len(extensions):
            raise ValueError("extensions: duplicate entries")
        return extensions


class RemovalPolicies(SpecModel):
    roles: RemovalPolicy = Field(
        "retain",
        description="A role removed from spec.roles: 'retain' leaves it (and its password) in the database, "
        "no longer managed; 'delete' reassigns what it owns to the application owner, drops its privileges "
        "and drops it (a role that still owns a database is kept and reported).",
    )
    databases: RemovalPolicy = Field(
        "retain",
        description="A database removed from spec.databases: 'retain' leaves it, no longer managed; 'delete' "
        "drops it with its data (connections are ended).",
    )


# Before PostgreSQL 16, CREATEROLE may grant membership in any role but a superuser, the predefined roles
# that run programs and read or write files as the server's OS user among them: there, it is superuser
# power. From 16 on, a CREATEROLE role administers only the roles it created.
CREATEROLE_ON_15_MESSAGE = (
    "roles: createrole is refused on version 15, where it can grant pg_execute_server_program (superuser "
    "power); it is allowed from version 16"
)

# Rules on the spec that span fields: owners must be declared (or the application owner), and the
# application owner is the operator's (Secret <name>-app), not a declared role.
SPEC_RULES = (
    rule(
        "!has(self.roles) || self.roles.all(r, r.name != self.bootstrap.initdb.owner)",
        "roles: the application owner (spec.bootstrap.initdb.owner) is the operator's role, with Secret "
        "<name>-app; it cannot be declared",
        fieldPath=".roles",
    ),
    rule(
        "!has(self.roles) || self.version != '15' || self.roles.all(r, !has(r.createrole) || !r.createrole)",
        CREATEROLE_ON_15_MESSAGE,
        fieldPath=".roles",
    ),
    rule(
        "!has(self.databases) || self.databases.all(d, d.name != self.bootstrap.initdb.database)",
        "databases: the application database (spec.bootstrap.initdb.database) is created by the operator; "
        "declare another",
        fieldPath=".databases",
    ),
    rule(
        "!has(self.databases) || self.databases.all(d, d.owner == self.bootstrap.initdb.owner || "
        "(has(self.roles) && self.roles.exists(r, r.name == d.owner)))",
        "databases: each owner must be a role in spec.roles or the application owner",
        fieldPath=".databases",
    ),
    rule(
        "!has(self.databases) || self.databases.all(d, !has(d.schemas) || d.schemas.all(s, !has(s.owner) || "
        "s.owner == self.bootstrap.initdb.owner || "
        "(has(self.roles) && self.roles.exists(r, r.name == s.owner))))",
        "databases: each schema owner must be a role in spec.roles or the application owner",
        fieldPath=".databases",
    ),
)


def spec_problems(
    roles: list[Role], databases: list[Database], app_owner: str, app_database: str, version: str
) -> list[str]:
    """The SPEC_RULES as the operator checks them (the same refusals, the same words)."""
    problems = []
    if version == "15" and any(r.createrole for r in roles):
        problems.append(CREATEROLE_ON_15_MESSAGE)
    declared = {r.name for r in roles}
    if len(declared) != len(roles):
        problems.append("roles: duplicate names")
    if len({d.name for d in databases}) != len(databases):
        problems.append("databases: duplicate names")
    if app_owner in declared:
        problems.append(
            "roles: the application owner (spec.bootstrap.initdb.owner) is the operator's role, "
            "with Secret <name>-app; it cannot be declared"
        )
    if any(d.name == app_database for d in databases):
        problems.append(
            "databases: the application database (spec.bootstrap.initdb.database) is created by "
            "the operator; declare another"
        )
    owners = declared | {app_owner}
    if any(d.owner not in owners for d in databases):
        problems.append("databases: each owner must be a role in spec.roles or the application owner")
    if any(s.owner is not None and s.owner not in owners for d in databases for s in d.schemas):
        problems.append("databases: each schema owner must be a role in spec.roles or the application owner")
    return problems
