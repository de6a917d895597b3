"""The smaller sections of a PostgresCluster's spec (resources, synchronous replication, the bootstrap
database, Patroni's timing) and the values the cluster's schema and CEL rules are built from. Like
api/cluster.py, each constraint is both a schema keyword or CEL rule and a pydantic check."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from pg_operator.api.backup import (
    RecoveryBootstrap,
)
from pg_operator.api.bootstrap_import import ImportBootstrap
from pg_operator.api.constants import REPLICATION_USER, SUPERUSER
from pg_operator.api.quantity import Quantity, parse_quantity
from pg_operator.api.roles import SPECIAL_ROLE_NAMES
from pg_operator.api.schema import (
    SpecModel,
    requests_within_limits,
    rule,
    validations,
)

# --- values the schema and CEL rules are built from -----------------------------------------------------

MAX_REPLICAS = 5
MAX_SYNC_STANDBYS = 4
STORAGE_PATTERN = r"^[1-9][0-9]*Gi$"

# Unquoted PostgreSQL identifiers (lower case, at most 63 bytes) that are not taken by the operator or by
# PostgreSQL itself.
IDENTIFIER_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
RESERVED_DATABASES: tuple[str, ...] = ("postgres", "template0", "template1")
# What the bootstrap database's owner may not be (the roles the instances create are not made yet then).
RESERVED_ROLES: tuple[str, ...] = (SUPERUSER, REPLICATION_USER, *SPECIAL_ROLE_NAMES)

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Printable ASCII without spaces: the API server refuses an image with surrounding whitespace on the
# StatefulSet, and no registry reference holds a space or a control character.
IMAGE_PATTERN = "^[!-~]+$"
IMAGE_MESSAGE = "image must be an image reference: printable ASCII characters, no spaces"


def cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


# --- shared field types ---------------------------------------------------------------------------------


Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN, min_length=1, max_length=63)]


def nested(cls: type[SpecModel], description: str, **extra: Any) -> Any:
    """A sub-object that may be omitted. Its schema default is the whole default object (not `{}`): the
    API server checks a default against the object's CEL rules as it stands, before nested defaults."""
    default = cls().model_dump(by_alias=True, exclude_none=True, mode="json")
    return Field(
        default_factory=cls, description=description, json_schema_extra={"default": default, **extra}
    )


# --- spec -----------------------------------------------------------------------------------------------


class ResourceRequests(SpecModel):
    cpu: Quantity = Field("250m", description="CPU each instance requests.")
    memory: Quantity = Field("512Mi", description="Memory each instance requests.")


class ResourceLimits(SpecModel):
    cpu: Quantity | None = Field(
        None, description="CPU limit. Unset by default: CPU throttling hurts PostgreSQL latency."
    )
    memory: Quantity | None = Field(
        None, description="Memory limit. Defaults to the memory request, so PostgreSQL gets what it asks for."
    )


class Resources(SpecModel):
    model_config = ConfigDict(json_schema_extra=validations(*requests_within_limits("resources")))

    requests: ResourceRequests = nested(ResourceRequests, "Resources each instance requests.")
    limits: ResourceLimits = nested(ResourceLimits, "Resource limits of each instance.")

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for res in ("cpu", "memory"):
            request, limit = getattr(self.requests, res), getattr(self.limits, res)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(f"resources.requests.{res} must not exceed resources.limits.{res}")
        return self


class Synchronous(SpecModel):
    number: int = Field(
        0,
        ge=0,
        le=MAX_SYNC_STANDBYS,
        description=(
            "Standbys that must confirm each commit, any of the replicas (quorum commit; 0: asynchronous "
            "replication). Below replicas."
        ),
    )
    data_durability: Literal["required", "preferred"] = Field(
        "required",
        description=(
            "'required': writes wait while fewer synchronous standbys are available (no acknowledged write "
            "is ever lost); 'preferred': replication falls back to asynchronous so writes continue."
        ),
    )


class InitDB(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                f"!(self.database in {cel_list(RESERVED_DATABASES)})",
                f"bootstrap.initdb.database must not be one of {', '.join(RESERVED_DATABASES)}",
                fieldPath=".database",
            ),
            rule(
                f"!(self.owner in {cel_list(RESERVED_ROLES)}) && !self.owner.startsWith('pg_')",
                f"bootstrap.initdb.owner must not start with pg_ or be one of {', '.join(RESERVED_ROLES)}",
                fieldPath=".owner",
            ),
        )
    )

    database: Identifier = Field("app", description="Database created for the application.")
    owner: Identifier = Field(
        "app", description="Role that owns it; its credentials are in Secret <name>-app."
    )

    @model_validator(mode="after")
    def _not_reserved(self) -> InitDB:
        if self.database in RESERVED_DATABASES:
            raise ValueError(f"bootstrap.initdb.database must not be one of {', '.join(RESERVED_DATABASES)}")
        if self.owner in RESERVED_ROLES or self.owner.startswith("pg_"):
            raise ValueError(
                f"bootstrap.initdb.owner must not start with pg_ or be one of {', '.join(RESERVED_ROLES)}"
            )
        return self


class Bootstrap(SpecModel):
    # At most one of recovery and import (`import` is a CEL keyword: escaped as __import__).
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!(has(self.recovery) && has(self.__import__))",
                "bootstrap: set at most one of recovery and import",
            )
        )
    )

    initdb: InitDB = nested(
        InitDB,
        "The application database and owner. A new cluster: initdb, then both are created. With recovery: "
        "no initdb; after the restore the owner is created if the restored catalog lacks it (otherwise its "
        "password is reset to Secret <name>-app's) and the database is created empty if missing "
        "(otherwise kept as restored, owner included).",
    )
    recovery: RecoveryBootstrap | None = Field(
        None,
        description=(
            "Create the cluster from another cluster's base backup and WAL (point-in-time restore) instead "
            "of initdb."
        ),
    )
    import_: ImportBootstrap | None = Field(
        None,
        alias="import",
        description=(
            "Fill the new cluster from an external PostgreSQL server by a logical dump and restore, run by "
            "a Job after initdb and before the cluster is Ready (docs/import.md)."
        ),
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Bootstrap:
        if self.recovery is not None and self.import_ is not None:
            raise ValueError("bootstrap: set at most one of recovery and import")
        return self


class Patroni(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "self.loopWait + 2 * self.retryTimeout <= self.ttl",
                "patroni: loopWait + 2 * retryTimeout must not exceed ttl",
                fieldPath=".ttl",
            )
        )
    )

    # Shorter than Patroni's 30/10/10: an unclean failover takes about ttl (the operator cuts that short
    # when the kubelet reports the primary's container dead). Patroni 4 raises a ttl below 20 and a
    # retry_timeout below 3 to those floors, so smaller values are refused rather than silently changed.
    ttl: int = Field(20, ge=20, le=600, description="Seconds the leader lock lives without renewal.")
    loop_wait: int = Field(5, ge=1, le=60, description="Seconds between Patroni's HA loop runs.")
    retry_timeout: int = Field(
        5, ge=3, le=120, description="Seconds Patroni retries the API server and PostgreSQL before demoting."
    )

    @model_validator(mode="after")
    def _timing(self) -> Patroni:
        if self.loop_wait + 2 * self.retry_timeout > self.ttl:
            raise ValueError("patroni: loopWait + 2 * retryTimeout must not exceed ttl")
        return self
