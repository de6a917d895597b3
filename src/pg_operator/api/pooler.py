"""Types of `spec.pooler`: PgBouncer in front of the cluster, driven by the operator (docs/pooler.md).

Part of the cluster, not a resource of its own: its TLS, its credentials and the pause around a
switchover are the cluster's, and the reconcile that switches over is the one that pauses. Presence turns
it on; removing it removes the pooler's children.

Also the pod labels the pooler's pieces share, so the instances' NetworkPolicy and the
pooler's builders agree without importing each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from pg_operator.api.quantity import Quantity, parse_quantity
from pg_operator.api.schema import SpecModel, requests_within_limits, rule, validations

# On every pooler pod (never the cluster label: the instances' Services and the cache select on that).
POOLER_LABEL = "db.example.com/pooler"
POOLER_SIDE_LABEL = "db.example.com/pooler-side"
POOLER_APP_NAME = "pgbouncer"
SIDES = ("rw", "ro")

MAX_INSTANCES = 10
MAX_POOL_SIZE = 10000
MAX_CLIENT_CONNECTIONS = 100000
MAX_PREPARED_STATEMENTS = 10000  # pooler/config.py accepts the same range


def pooler_pod_labels(cluster_name: str, side: str) -> dict[str, str]:
    """The labels of one side's pooler pods (its Deployment's selector: never add to them)."""
    return {"app.kubernetes.io/name": POOLER_APP_NAME, POOLER_LABEL: cluster_name, POOLER_SIDE_LABEL: side}


def any_pooler_pod(cluster_name: str) -> dict[str, str]:
    """Labels every pooler pod of a cluster carries, either side."""
    return {"app.kubernetes.io/name": POOLER_APP_NAME, POOLER_LABEL: cluster_name}


class PoolerRequests(SpecModel):
    cpu: Quantity = Field("50m", description="CPU each pooler pod requests.")
    memory: Quantity = Field("64Mi", description="Memory each pooler pod requests.")


class PoolerLimits(SpecModel):
    cpu: Quantity | None = Field(None, description="CPU limit of each pooler pod (unset by default).")
    memory: Quantity | None = Field(
        None, description="Memory limit of each pooler pod; defaults to its memory request."
    )


class PoolerResources(SpecModel):
    model_config = ConfigDict(json_schema_extra=validations(*requests_within_limits("pooler.resources")))

    requests: PoolerRequests = Field(
        default_factory=PoolerRequests, json_schema_extra={"default": {"cpu": "50m", "memory": "64Mi"}}
    )
    limits: PoolerLimits = Field(default_factory=PoolerLimits, json_schema_extra={"default": {}})

    @model_validator(mode="after")
    def _requests_within_limits(self) -> PoolerResources:
        for res in ("cpu", "memory"):
            request, limit = getattr(self.requests, res), getattr(self.limits, res)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(f"pooler.resources.requests.{res} must not exceed "
                                 f"pooler.resources.limits.{res}")  # fmt: skip
        return self


class PoolerSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!has(self.defaultPoolSize) || !has(self.maxClientConnections) || "
                "self.defaultPoolSize <= self.maxClientConnections",
                "pooler.defaultPoolSize must not exceed pooler.maxClientConnections",
                fieldPath=".defaultPoolSize",
            ),
        )
    )

    instances: int = Field(
        2,
        ge=1,
        le=MAX_INSTANCES,
        description="PgBouncer pods per side (a PodDisruptionBudget when more than one).",
    )
    mode: Literal["transaction", "session"] = Field(
        "transaction",
        description="PgBouncer's pool_mode: a server connection per transaction or per session.",
    )
    read_only: bool = Field(False, description="Also a `<name>-pooler-ro` side, in front of the replicas.")
    default_pool_size: int | None = Field(
        None,
        ge=1,
        le=MAX_POOL_SIZE,
        description="Server connections per user and database (PgBouncer's default_pool_size; default 20).",
    )
    max_client_connections: int | None = Field(
        None,
        ge=1,
        le=MAX_CLIENT_CONNECTIONS,
        description="Client connections each pooler pod accepts (PgBouncer's max_client_conn; default 1000).",
    )
    max_prepared_statements: int | None = Field(
        None,
        ge=0,
        le=MAX_PREPARED_STATEMENTS,
        description="Protocol-level prepared statements PgBouncer keeps on each server connection; it "
        "prepares a client's statement on whichever server connection runs the client's transaction, so "
        "drivers that prepare statements by default work in transaction mode (PgBouncer's "
        "max_prepared_statements; default 200; 0 turns the support off).",
    )
    # The whole default object, not {}: the API server checks a default against the object's CEL rules as
    # it stands, before nested defaults (its rules read self.limits).
    resources: PoolerResources = Field(
        default_factory=PoolerResources,
        description="CPU and memory of each pooler pod.",
        json_schema_extra={"default": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {}}},
    )

    @model_validator(mode="after")
    def _pool_within_clients(self) -> PoolerSpec:
        if (self.default_pool_size is not None and self.max_client_connections is not None
                and self.default_pool_size > self.max_client_connections):  # fmt: skip
            raise ValueError("pooler.defaultPoolSize must not exceed pooler.maxClientConnections")
        return self

    @property
    def sides(self) -> tuple[str, ...]:
        return SIDES if self.read_only else SIDES[:1]

    @property
    def memory_limit(self) -> str:
        return self.resources.limits.memory or self.resources.requests.memory
