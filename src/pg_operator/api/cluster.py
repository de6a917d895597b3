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
    recovery_conflict,
)
from pg_operator.api.cluster_sections import (
    DNS_SUBDOMAIN_PATTERN,
    IMAGE_MESSAGE,
    IMAGE_PATTERN,
    MAX_REPLICAS,
    STORAGE_PATTERN,
    Bootstrap,
    Patroni,
    Resources,
    Synchronous,
    nested,
)
from pg_operator.api.cluster_status import PostgresClusterStatus
from pg_operator.api.constants import KIND, PLURAL, SHORT
from pg_operator.api.crd import CustomResource
from pg_operator.api.lifecycle import (
    FENCED_DESCRIPTION,
    FENCING_ROOT_RULES,
    HIBERNATION_DESCRIPTION,
    MAX_FENCED,
    FencedName,
    fencing_problems,
)
from pg_operator.api.monitoring import MonitoringSpec
from pg_operator.api.network_policy import NetworkPolicySpec
from pg_operator.api.node_loss import NodeLoss
from pg_operator.api.parameters import SPEC_RULES as PARAMETERS_SPEC_RULES
from pg_operator.api.parameters import missing_library_problems, unpreloaded_extension_problems
from pg_operator.api.placement import (
    MAX_LABEL_VALUE_LENGTH,
    NODE_SELECTOR_KEY_RULE,
    NODE_SELECTOR_VALUE_RULE,
    Affinity,
    Disruption,
    Toleration,
    node_selector_problems,
)
from pg_operator.api.pooler import PoolerSpec
from pg_operator.api.postgresql import Postgresql
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
    rule,
    validations,
)
from pg_operator.api.services import ROOT_SERVICES_RULES, ServicesSpec, additional_problems
from pg_operator.api.tls import TlsSpec
from pg_operator.images import SUPPORTED_MAJORS

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
    *PARAMETERS_SPEC_RULES,
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
    resources: Resources = nested(Resources, "CPU and memory of each instance.")
    postgresql: Postgresql = nested(Postgresql, "PostgreSQL configuration.")
    affinity: Affinity = nested(Affinity, "Placement of the instances.")
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
    disruption: Disruption = nested(
        Disruption, "What node drains may do to the instances (docs/high-availability.md#drains)."
    )
    synchronous: Synchronous = nested(Synchronous, "Synchronous replication.")
    bootstrap: Bootstrap = nested(
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
    patroni: Patroni = nested(Patroni, "Patroni timing: how fast a failed primary is replaced.")
    node_loss: NodeLoss = nested(
        NodeLoss,
        "What happens to an instance whose node is lost: always reported; replaced on another node when "
        "allowed (docs/high-availability.md).",
    )
    network_policy: NetworkPolicySpec = nested(
        NetworkPolicySpec,
        "Who may reach the instances over the network (a NetworkPolicy, on by default; docs/network.md).",
    )
    tls: TlsSpec = nested(
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
    removal_policy: RemovalPolicies = nested(
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
    monitoring: MonitoringSpec = nested(
        MonitoringSpec, "Metrics beyond the built-in set: the tenant's own queries (docs/monitoring.md)."
    )
    services: ServicesSpec = nested(
        ServicesSpec,
        "How clients reach the cluster: annotations and labels on the operator's Services, and extra "
        "NodePort or LoadBalancer Services the operator keeps (docs/exposure.md).",
    )
    hibernation: bool = Field(False, description=HIBERNATION_DESCRIPTION)
    fenced_instances: list[FencedName] | None = Field(
        None, max_length=MAX_FENCED, description=FENCED_DESCRIPTION
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
    def _libraries_in_the_image(self) -> PostgresClusterSpec:
        params = self.postgresql.parameters
        declared = [ext for db in self.databases or () for ext in db.extensions]
        problems = [*missing_library_problems(params, self.version),
                    *unpreloaded_extension_problems(params, declared)]  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
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

    @model_validator(mode="after")
    def _services_names(self) -> PostgresCluster:
        # Needs the name (the operator's Service names) and the pooler; ROOT_SERVICES_RULES is the same test.
        sides = self.spec.pooler.sides if self.spec.pooler is not None else ()
        problems = additional_problems(self.name, self.spec.services, sides)
        if problems:
            raise ValueError("; ".join(f"spec.{p}" for p in problems))
        return self

    @model_validator(mode="after")
    def _fenced_instances_of_this_cluster(self) -> PostgresCluster:
        problems = fencing_problems(self.name, self.spec.replicas, self.spec.fenced_instances or ())
        if problems:
            raise ValueError("; ".join(problems))
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
# restored cluster must not archive into its source's path (ROOT_BACKUP_RULES, api/backup.py); fenced
# instances must be this cluster's (FENCING_ROOT_RULES, api/lifecycle.py).
NAME_RULE = rule(
    f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    f"metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters starting with a letter "
    "(Services and pods are named after it)",
)
ROOT_RULES: tuple[dict[str, str], ...] = (
    NAME_RULE,
    *ROOT_BACKUP_RULES,
    *ROOT_SERVICES_RULES,
    *FENCING_ROOT_RULES,
)

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
