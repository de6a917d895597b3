"""ConfigMap `<name>-instance`: the instance configuration the pod entrypoint turns into Patroni's."""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import INSTANCE_CONFIG_KEY
from pg_operator.api.instance_config import (
    BootstrapSettings,
    InstanceConfig,
    PatroniSettings,
    PostgresqlSettings,
    SynchronousSettings,
)
from pg_operator.orchestration.patroni_settings import desired_dynamic_settings
from pg_operator.specs import names
from pg_operator.specs.backup_pod import instance_backup_section
from pg_operator.specs.labels import COMPONENT_CONFIG, child_metadata


def instance_config(cluster: PostgresCluster, fenced: frozenset[str] = frozenset()) -> InstanceConfig:
    """`fenced`: the instances told to stop PostgreSQL (orchestration/fencing.py, hibernation.py)."""
    spec = cluster.spec
    return InstanceConfig(
        cluster=cluster.name,
        namespace=cluster.namespace,
        pg_major=spec.version,
        postgresql=PostgresqlSettings(
            parameters=dict(spec.postgresql.parameters), allowed_cidrs=list(spec.postgresql.allowed_cidrs)
        ),
        bootstrap=BootstrapSettings(
            database=spec.bootstrap.initdb.database, owner=spec.bootstrap.initdb.owner
        ),
        synchronous=SynchronousSettings(
            number=spec.synchronous.number, data_durability=spec.synchronous.data_durability
        ),
        patroni=PatroniSettings(
            ttl=spec.patroni.ttl, loop_wait=spec.patroni.loop_wait, retry_timeout=spec.patroni.retry_timeout
        ),
        # Where WAL goes and, for a restored cluster, where it comes from; no credentials (pod env only).
        backup=instance_backup_section(cluster.name, spec.backup, spec.bootstrap.recovery),
        fenced=sorted(fenced) or None,
    )


def configmap(cluster: PostgresCluster, fenced: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(cluster, names.instance(cluster), COMPONENT_CONFIG),
        "data": {INSTANCE_CONFIG_KEY: instance_config(cluster, fenced).to_yaml()},
    }


def dynamic_settings(cluster: PostgresCluster) -> dict[str, Any]:
    """What Patroni's dynamic configuration must hold for this cluster (kept there by the operator after
    bootstrap; the entrypoint seeds the same values from instance.yaml at initdb)."""
    config = instance_config(cluster)
    timing = {
        "ttl": config.patroni.ttl,
        "loop_wait": config.patroni.loop_wait,
        "retry_timeout": config.patroni.retry_timeout,
    }
    return desired_dynamic_settings(
        config.postgresql.parameters, config.synchronous.number, config.synchronous.data_durability, timing
    )
