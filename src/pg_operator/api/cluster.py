"""Typed models of the PostgresCluster resource: the single source of truth for its CRD.

Each constraint lives twice on purpose, from one definition: as JSON-schema keywords or CEL rules in the
CRD (so the API server refuses bad input before the operator sees it) and as pydantic validation (so
`PostgresCluster.from_obj` refuses the same input with an error naming the field, should the schema ever
be bypassed). Rules that compare with the previous object (growth, immutability) exist only in CEL.
`POSTGRES_CLUSTER` describes the kind for `api/crd.py`, which builds its CRD.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from pg_operator.api.backup import (
    ROOT_BACKUP_RULES,
    BackupConfiguration,
    RecoveryBootstrap,
    recovery_conflict,
)
from pg_operator.api.cluster_status import PostgresClusterStatus
from pg_operator.api.constants import KIND, PLURAL, SHORT
from pg_operator.api.crd import CustomResource
from pg_operator.api.network_policy import NetworkPolicySpec
from pg_operator.api.placement import (
    MAX_LABEL_VALUE_LENGTH,
    NODE_SELECTOR_KEY_RULE,
    NODE_SELECTOR_VALUE_RULE,
    Affinity,
    Toleration,
    node_selector_problems,
)
from pg_operator.api.pooler import PoolerSpec
from pg_operator.api.postgresql import Postgresql
from pg_operator.api.quantity import Quantity, parse_quantity
from pg_operator.api.roles import (
    MAX_DATABASES,
    MAX_ROLES,
    Database,
    RemovalPolicies,
    Role,
    spec_problems,
)
from pg_operator.api.roles import SPEC_RULES as ROLES_SPEC_RULES
from pg_operator.api.schema import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    SpecModel,
    requests_within_limits,
    rule,
    validations,
)
from pg_operator.api.tls import TlsSpec
from pg_operator.images import SUPPORTED_MAJORS

# --- values the schema and CEL rules are built from -----------------------------------------------------

MAX_REPLICAS = 5
MAX_SYNC_STANDBYS = 4
STORAGE_PATTERN = r"^[1-9][0-9]*Gi$"

# Unquoted PostgreSQL identifiers (lower case, at most 63 bytes) that are not taken by the operator or by
# PostgreSQL itself.
IDENTIFIER_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
RESERVED_DATABASES: tuple[str, ...] = ("postgres", "template0", "template1")
RESERVED_ROLES: tuple[str, ...] = (
    "postgres",
    "replicator",
    "public",
    "none",
    "current_role",
    "current_user",
    "session_user",
    "user",
    "all",
)

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Printable ASCII without spaces: the API server refuses an image with surrounding whitespace on the
# StatefulSet, and no registry reference holds a space or a control character.
IMAGE_PATTERN = "^[!-~]+$"
IMAGE_MESSAGE = "image must be an image reference: printable ASCII characters, no spaces"


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


# --- shared field types ---------------------------------------------------------------------------------


Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN, min_length=1, max_length=63)]


def _nested(cls: type[SpecModel], description: str, **extra: Any) -> Any:
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

    requests: ResourceRequests = _nested(ResourceRequests, "Resources each instance requests.")
    limits: ResourceLimits = _nested(ResourceLimits, "Resource limits of each instance.")

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
                f"!(self.database in {_cel_list(RESERVED_DATABASES)})",
                f"bootstrap.initdb.database must not be one of {', '.join(RESERVED_DATABASES)}",
                fieldPath=".database",
            ),
            rule(
                f"!(self.owner in {_cel_list(RESERVED_ROLES)}) && !self.owner.startsWith('pg_')",
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
    initdb: InitDB = _nested(
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


_SPEC_RULES = (
    rule(
        "!has(self.synchronous) || self.synchronous.number < self.replicas",
        "synchronous.number must be less than replicas: each synchronous standby is another instance",
        fieldPath=".synchronous.number",
    ),
    rule(
        "has(self.storageClassName) == has(oldSelf.storageClassName) && "
        "(!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        "storageClassName is immutable: existing volumes cannot move to another storage class in place",
        fieldPath=".storageClassName",
        reason="FieldValueForbidden",
    ),
    *ROLES_SPEC_RULES,
)


# Each value carries its own rule, so the API server's error names the key in its path.
_NodeSelectorValue = Annotated[
    str,
    StringConstraints(max_length=MAX_LABEL_VALUE_LENGTH),
    Field(json_schema_extra=validations(NODE_SELECTOR_VALUE_RULE)),
]


class PostgresClusterSpec(SpecModel):
    """The desired state of a PostgreSQL cluster."""

    model_config = ConfigDict(json_schema_extra=validations(*_SPEC_RULES))

    replicas: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Number of PostgreSQL instances: one primary, the rest streaming replicas.",
    )
    version: str = Field(
        description=(
            "PostgreSQL major version. Raising it upgrades the cluster in place (docs/major-upgrades.md); "
            "lowering it is refused."
        ),
        json_schema_extra={
            "enum": list(SUPPORTED_MAJORS),
            **validations(
                rule(
                    "int(self) >= int(oldSelf)",
                    "version may be raised (an in-place major upgrade) but never lowered",
                    messageExpression=(
                        "'version may be raised (an in-place major upgrade) but never lowered: ' "
                        "+ oldSelf + ' -> ' + self"
                    ),
                    reason="FieldValueForbidden",
                )
            ),
        },
    )
    storage: str = Field(
        pattern=STORAGE_PATTERN,
        max_length=12,
        description="Size of each instance's data volume, in Gi (e.g. 20Gi). May grow, never shrink.",
        json_schema_extra=validations(
            rule(
                "int(self.split('Gi')[0]) >= int(oldSelf.split('Gi')[0])",
                "storage may grow but never shrink",
                messageExpression="'storage may grow but never shrink: ' + oldSelf + ' -> ' + self",
            )
        ),
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="Container image; by default the operator's image for the major version.",
        json_schema_extra=validations(rule(f"self.matches('{IMAGE_PATTERN}')", IMAGE_MESSAGE)),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    storage_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="StorageClass of the data volumes; the cluster's default class when unset. Immutable.",
    )
    resources: Resources = _nested(Resources, "CPU and memory of each instance.")
    postgresql: Postgresql = _nested(Postgresql, "PostgreSQL configuration.")
    affinity: Affinity = _nested(Affinity, "Placement of the instances.")
    node_selector: dict[str, _NodeSelectorValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Nodes the instances may run on (node labels: label keys and values).",
        json_schema_extra=validations(NODE_SELECTOR_KEY_RULE),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Taints the instances tolerate."
    )
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of the instance pods, so a database is not the first thing evicted.",
    )
    synchronous: Synchronous = _nested(Synchronous, "Synchronous replication.")
    bootstrap: Bootstrap = _nested(
        Bootstrap,
        "How the cluster's data is created. Applied once, at creation; immutable.",
        **validations(
            rule(
                "self == oldSelf",
                "bootstrap is applied once, when the cluster is created, and cannot change",
                reason="FieldValueForbidden",
            )
        ),
    )
    patroni: Patroni = _nested(Patroni, "Patroni timing: how fast a failed primary is replaced.")
    network_policy: NetworkPolicySpec = _nested(
        NetworkPolicySpec,
        "Who may reach the instances over the network (a NetworkPolicy, on by default; docs/network.md).",
    )
    tls: TlsSpec = _nested(
        TlsSpec,
        "Certificates the user brings (a CA, or the server certificate) instead of the operator's own; "
        "TLS itself is always on (docs/tls.md).",
    )
    backup: BackupConfiguration | None = Field(
        None,
        description=(
            "Continuous WAL archiving and base backups to an S3-compatible store (barman-cloud). Unset: no "
            "archiving, and Backup/ScheduledBackup objects for this cluster fail."
        ),
    )
    # None rather than an empty list when unset: the API server stores no empty list it did not default.
    roles: list[Role] | None = Field(
        None,
        max_length=MAX_ROLES,
        description="Roles the operator creates and keeps as declared (docs/roles.md).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    databases: list[Database] | None = Field(
        None,
        max_length=MAX_DATABASES,
        description="Databases the operator creates and keeps as declared, with extensions and schemas.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    removal_policy: RemovalPolicies = _nested(
        RemovalPolicies, "What happens to a role or database removed from spec.roles or spec.databases."
    )
    pooler: PoolerSpec | None = Field(
        None,
        description=(
            "PgBouncer in front of the cluster (Services <name>-pooler-rw and, with readOnly, -pooler-ro), "
            "paused and re-pointed by the operator around switchovers and failovers (docs/pooler.md). "
            "Unset: no pooler."
        ),
    )

    @field_validator("version")
    @classmethod
    def _supported(cls, version: str) -> str:
        if version not in SUPPORTED_MAJORS:
            supported = ", ".join(SUPPORTED_MAJORS)
            raise ValueError(f"version {version!r} is not supported; supported: {supported}")
        return version

    @field_validator("image")
    @classmethod
    def _image(cls, image: str | None) -> str | None:
        if image is not None and not _matches(IMAGE_PATTERN, image):
            raise ValueError(IMAGE_MESSAGE)
        return image

    @field_validator("node_selector")
    @classmethod
    def _node_selector(cls, selector: dict[str, str]) -> dict[str, str]:
        problems = node_selector_problems(selector)
        if problems:
            raise ValueError(f"nodeSelector: {'; '.join(problems)}")
        return selector

    @model_validator(mode="after")
    def _sync_below_replicas(self) -> PostgresClusterSpec:
        if self.synchronous.number >= self.replicas:
            raise ValueError(
                "synchronous.number must be less than replicas: each synchronous standby is another instance"
            )
        return self

    @model_validator(mode="after")
    def _roles_and_databases(self) -> PostgresClusterSpec:
        problems = spec_problems(self.roles or [], self.databases or [], self.bootstrap.initdb.owner,
                                 self.bootstrap.initdb.database, self.version)  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def storage_gi(self) -> int:
        return int(self.storage[:-2])

    @property
    def memory_limit(self) -> str:
        """The memory limit the pods get: the explicit one, else the request."""
        return self.resources.limits.memory or self.resources.requests.memory


# --- status ---------------------------------------------------------------------------------------------


# --- the whole object -----------------------------------------------------------------------------------


def _format_errors(prefix: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(_located(prefix, loc, msg))
    return "; ".join(parts)


def _located(prefix: str, loc: list[str], msg: str) -> str:
    # Our own validators start their message with the field's path relative to the spec
    # ("postgresql.parameters: ...", "tolerations: ..."); put the full location in its place.
    if not loc:
        return f"{prefix}.{msg}"
    for k in range(len(loc), 0, -1):
        head = ".".join(loc[:k])
        if msg.startswith(head) and msg[len(head) : len(head) + 1] in (" ", ":", "."):
            return f"{prefix}.{'.'.join(loc)}{msg[len(head) :]}"
    return f"{prefix}.{'.'.join(loc)}: {msg}"


class PostgresCluster(BaseModel):
    """A parsed PostgresCluster object: identity from metadata plus the validated spec."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str
    generation: int
    labels: dict[str, str]
    spec: PostgresClusterSpec

    @model_validator(mode="after")
    def _restore_not_into_its_source(self) -> PostgresCluster:
        # Needs the name (the barman server name), so it lives here and not on the spec; the CRD's root
        # rule (ROOT_BACKUP_RULES) is the same test.
        recovery = self.spec.bootstrap.recovery
        if recovery is not None:
            conflict = recovery_conflict(self.name, self.spec.backup, recovery)
            if conflict:
                raise ValueError(f"spec.{conflict}")
        return self

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PostgresCluster:
        """Parse a whole object as the API server gives it; ValueError naming the field on bad input."""
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            raise ValueError("metadata: required")
        for key in ("name", "namespace", "uid"):
            if not isinstance(meta.get(key), str) or not meta[key]:
                raise ValueError(f"metadata.{key}: required")
        name = meta["name"]
        if len(name) > MAX_NAME_LENGTH or not _matches(NAME_PATTERN, name):
            raise ValueError(
                f"metadata.name: {name!r} must be a DNS label of at most {MAX_NAME_LENGTH} characters "
                "starting with a letter"
            )
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise ValueError("spec: required")
        try:
            parsed = PostgresClusterSpec.model_validate(spec)
        except ValidationError as err:
            raise ValueError(_format_errors("spec", err)) from None
        try:
            return cls(
                name=name,
                namespace=meta["namespace"],
                uid=meta["uid"],
                generation=int(meta.get("generation") or 0),
                labels=dict(meta.get("labels") or {}),
                spec=parsed,
            )
        except ValidationError as err:
            messages = (e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise ValueError("; ".join(messages)) from None


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


# Rules at the root of the CRD schema: names derived from metadata.name must stay valid (NAME_RULE); a
# restored cluster must not archive into its source's path (ROOT_BACKUP_RULES, api/backup.py).
NAME_RULE = rule(
    f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    f"metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters starting with a letter "
    "(Services and pods are named after it)",
)
ROOT_RULES: tuple[dict[str, str], ...] = (NAME_RULE, *ROOT_BACKUP_RULES)

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "description": "Desired instances"},
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.readyReplicas",
        "description": "Ready instances",
    },
    {"name": "Primary", "type": "string", "jsonPath": ".status.currentPrimary", "description": "Primary pod"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Version", "type": "string", "jsonPath": ".spec.version", "priority": 1},
    {"name": "Storage", "type": "string", "jsonPath": ".spec.storage", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

POSTGRES_CLUSTER = CustomResource(
    kind=KIND,
    plural=PLURAL,
    short=SHORT,
    description="A PostgreSQL cluster: a primary and streaming replicas managed by Patroni.",
    spec=PostgresClusterSpec,
    status=PostgresClusterStatus,
    columns=PRINTER_COLUMNS,
    root_rules=ROOT_RULES,
    # `kubectl scale pgc/<name> --replicas=N`, validated like any spec change.
    subresources={
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    },
)
