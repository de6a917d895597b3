"""Types of the PostgresCluster's `.status`: conditions, instances, archiving and backups. Written
only by the operator, so the CRD carries their shape without defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pg_operator.api.schema import StatusModel


class Condition(StatusModel):
    # ContinuousArchiving, LastBackupSucceeded and BackupStoreCleanup are the backup reconcilers'
    # (controller/backup_reconcilers; specs/backup_status.py keeps them); RolesApplied and DatabasesApplied
    # the roles sub-reconciler's (controller/reconcilers/roles.py), present only while spec.roles or
    # spec.databases are; Pooler the pooler sub-reconciler's (controller/reconcilers/pooler.py), present only
    # while spec.pooler is; Hibernated and Fenced the lifecycle sub-reconciler's
    # (controller/reconcilers/lifecycle.py), present while spec.hibernation or spec.fencedInstances is.
    type: Literal[
        "Ready",
        "Progressing",
        "Degraded",
        "ContinuousArchiving",
        "LastBackupSucceeded",
        "BackupStoreCleanup",
        "RolesApplied",
        "DatabasesApplied",
        "Pooler",
        "Hibernated",
        "Fenced",
    ]
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(max_length=32768)
    observed_generation: int = Field(ge=0)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})


class InstanceStatus(StatusModel):
    name: str
    role: str = Field(description="primary, replica, or unknown while Patroni has not labelled the pod.")
    ready: bool
    timeline: int | None = Field(None, description="PostgreSQL timeline as Patroni reports it.")
    lag_bytes: int | None = Field(
        None,
        ge=0,
        description="Replicas: bytes behind the primary's WAL position, as Patroni reports both, rounded "
        "down to whole MiB (exact figures in the operator's metrics).",
    )
    pending_restart: list[str] | None = Field(
        None,
        description="Settings this instance has taken but applies only after a restart (the operator "
        "restarts instances one at a time, replicas first).",
    )


class ArchivingStatus(StatusModel):
    """Archiving's state as of its last change (primary, working or failing, backlog): a healthy primary's
    every archived segment does not rewrite the status. The live figures are in the primary's
    `db.example.com/archiving` annotation (`kubectl pgc status` shows them) and its pg_stat_archiver
    metrics."""

    primary: str | None = Field(None, description="Instance whose pg_stat_archiver this is.")
    last_archived_wal: str | None = Field(
        None, alias="lastArchivedWAL", description="A segment archived when the state last changed."
    )
    last_archived_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    pending_wal: int | None = Field(
        None, alias="pendingWAL", ge=0,
        description="WAL segments waiting to be archived (0 below 4, then rounded down to a power of two).",
    )  # fmt: skip
    last_failed_wal: str | None = Field(None, alias="lastFailedWAL")
    last_failed_time: str | None = Field(None, json_schema_extra={"format": "date-time"})


class BackupGenerationStatus(StatusModel):
    """One major's place in the store: after an in-place major upgrade each major archives apart."""

    server_name: str = Field(description="barman's server name: the objects under <path>/<serverName>/.")
    major: str = Field(description="The PostgreSQL major whose WAL and base backups it holds.")
    since: str | None = Field(
        None,
        json_schema_extra={"format": "date-time"},
        description="When the previous generation stopped taking writes (absent for the first).",
    )


class StoreOwnershipStatus(StatusModel):
    """The last verdict on who owns the cluster's store prefix (backup/store_policy.py): a restarted
    operator trusts a recorded "owned" for an unchanged spec.backup instead of asking the store."""

    identity: str = Field(max_length=64, description="Digest of the store and spec.backup it holds for.")
    verdict: Literal["owned", "notOwned"] = Field(description="Whether the prefix is this cluster's.")
    reason: str = Field(max_length=256, description="The verdict's reason.")
    checked_at: str = Field(json_schema_extra={"format": "date-time"}, description="When it was asked.")


class BackupClusterStatus(StatusModel):
    archiving: ArchivingStatus | None = Field(None, description="WAL archiving as the primary reports it.")
    generations: list[BackupGenerationStatus] | None = Field(
        None,
        max_length=64,
        description="The store's generations, oldest first, once the major was upgraded in place.",
    )
    last_successful_backup: str | None = Field(None, description="Name of the newest completed Backup.")
    last_successful_backup_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    store_ownership: StoreOwnershipStatus | None = Field(
        None, description="Who owns the store prefix, as last asked of the store."
    )


class DeclaredObjectStatus(StatusModel):
    """One entry of spec.roles or spec.databases (or one removed from them and not yet released) as the
    database holds it."""

    name: str
    applied: bool = Field(description="The database holds it as declared.")
    reason: str | None = Field(None, max_length=4096, description="Why it is not (yet) as declared.")


class HibernationStatus(StatusModel):
    """Where a hibernation or a wake stands (orchestration/hibernation.py), kept here so an operator
    restarted in the middle carries on: the primary it recorded before stopping is the one it starts
    first."""

    phase: Literal["StoppingReplicas", "StoppingPrimary", "Hibernated", "WakingPrimary"] = Field(
        description="The step of the hibernation or the wake."
    )
    primary: str | None = Field(None, description="The instance that was primary when the cluster stopped.")


class ImportStatus(StatusModel):
    """spec.bootstrap.import's progress (orchestration/bootstrap_import.py)."""

    phase: Literal["Pending", "Dumping", "Restoring", "Succeeded", "Failed"] = Field(
        description="Where the import is."
    )
    database: str | None = Field(None, description="The source database being worked on.")
    databases_done: int = Field(0, ge=0, description="Databases restored.")
    databases_total: int = Field(0, ge=0, description="Databases to import.")
    objects: int | None = Field(None, ge=0, description="Objects in the dump's table of contents.")
    job: str | None = Field(None, description="The Job that runs it.")
    message: str | None = Field(None, max_length=1024, description="Why it failed (the Job's last words).")
    attempt: int = Field(0, ge=0, description="Jobs run so far; deleting a failed Job runs another.")


class PostgresClusterStatus(StatusModel):
    """What the operator observed; written only when it changes."""

    phase: str = Field("", description="One readable word or sentence: Creating, Healthy, Scaling 3 → 5, ...")
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int = Field(0, ge=0, description="metadata.generation this status describes.")
    replicas: int = Field(0, ge=0, description="Instances that exist.")
    ready_replicas: int = Field(0, ge=0, description="Instances that are ready.")
    current_primary: str = Field("", description="Pod that holds the primary role; empty when none.")
    instances: list[InstanceStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    selector: str = Field("", description="Label selector of the instance pods (for the scale subresource).")
    backup: BackupClusterStatus | None = Field(None, description="Backups and WAL archiving (spec.backup).")
    import_: ImportStatus | None = Field(
        None, alias="import", description="The progress of bootstrap.import."
    )
    roles: list[DeclaredObjectStatus] | None = Field(
        None,
        description="Each declared role, checked against the database (docs/roles.md).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    databases: list[DeclaredObjectStatus] | None = Field(
        None,
        description="Each declared database, with its extensions and schemas, checked against the database.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    hibernation: HibernationStatus | None = Field(
        None, description="A hibernation or a wake in progress, or done (spec.hibernation)."
    )
    fenced_instances: list[str] | None = Field(
        None, description="Instances whose PostgreSQL is stopped because spec.fencedInstances names them."
    )
