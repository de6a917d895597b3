"""The instance configuration: what the operator tells each pod's entrypoint, as `instance.yaml`.

The operator renders it into ConfigMap `<name>-instance` (key `instance.yaml`, mounted at
/etc/pg-operator/config); the instance entrypoint reads it with `InstanceConfig.load()` and renders
Patroni's configuration from it. One model on both sides, so they cannot disagree on a key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator

from pg_operator.api.constants import (
    CLUSTER_LABEL,
    CONFIG_MOUNT,
    INSTANCE_CONFIG_KEY,
    PATRONI_PORT,
    PG_PORT,
    REPLICATION_USER,
    ROLE_LABEL,
    SUPERUSER,
)
from pg_operator.api.schema import SpecModel

INSTANCE_CONFIG_PATH = Path(CONFIG_MOUNT) / INSTANCE_CONFIG_KEY


class Labels(SpecModel):
    cluster_label: str = CLUSTER_LABEL  # on every pod, value = cluster name; Patroni's member selector
    role_label: str = ROLE_LABEL  # Patroni sets it to "primary" / "replica"


class PostgresqlSettings(SpecModel):
    port: int = PG_PORT
    parameters: dict[str, str] = Field(default_factory=dict)  # user's postgresql.conf settings, validated
    allowed_cidrs: list[str] = Field(alias="allowedCIDRs")  # password (scram) access in pg_hba


class BootstrapSettings(SpecModel):
    database: str
    owner: str


class SynchronousSettings(SpecModel):
    number: int  # 0 = asynchronous
    data_durability: Literal["required", "preferred"]  # required → Patroni synchronous_mode_strict


class PatroniSettings(SpecModel):
    ttl: int
    loop_wait: int
    retry_timeout: int
    port: int = PATRONI_PORT


class Users(SpecModel):
    superuser: str = SUPERUSER
    replication: str = REPLICATION_USER


class InstanceConfig(SpecModel):
    cluster: str  # Patroni scope; its DCS ConfigMaps are <cluster>-config, -leader, -failover, -sync
    namespace: str
    pg_major: str
    labels: Labels = Field(default_factory=Labels)
    users: Users = Field(default_factory=Users)
    postgresql: PostgresqlSettings
    bootstrap: BootstrapSettings
    synchronous: SynchronousSettings
    patroni: PatroniSettings
    # Archiving and a restore (backup.instance_section: {archive: …, recovery: …}); absent when the
    # cluster has neither. Plain camelCase mappings: their contents are checked by the parsers that read
    # them (instance_hook.apply, when the entrypoint renders Patroni's config), only their shape here.
    backup: dict[str, Any] | None = None
    # Instances (pod names) that must not run PostgreSQL: fenced, or stopped for a hibernation. The
    # entrypoint of each listed instance stops Patroni and keeps its pod (instance/fencing.py). Absent
    # when none, so older entrypoints read the same file as before.
    fenced: list[str] | None = None

    @field_validator("backup")
    @classmethod
    def _backup_section(cls, backup: dict[str, Any] | None) -> dict[str, Any] | None:
        if backup is None:
            return None
        unknown = sorted(set(backup) - {"archive", "recovery"})
        if unknown:
            raise ValueError(f"backup: unknown keys {', '.join(unknown)} (expected archive, recovery)")
        for key in ("archive", "recovery"):
            if backup.get(key) is not None and not isinstance(backup[key], dict):
                raise ValueError(f"backup.{key}: expected a mapping")
        return backup

    def to_yaml(self) -> str:
        # exclude_none: a cluster without backups gets the same instance.yaml as before they existed.
        return yaml.safe_dump(
            self.model_dump(by_alias=True, mode="json", exclude_none=True),
            sort_keys=True,
            default_flow_style=False,
        )

    @classmethod
    def from_yaml(cls, text: str) -> InstanceConfig:
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError(f"{INSTANCE_CONFIG_KEY}: expected a mapping")
        return cls.model_validate(data)

    @classmethod
    def load(cls, path: Path = INSTANCE_CONFIG_PATH) -> InstanceConfig:
        return cls.from_yaml(path.read_text(encoding="utf-8"))
