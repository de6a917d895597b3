"""Names shared by the API, the desired-state builders, the controller and the instance entrypoint.

Binding values: see docs/architecture.md. Change one only together with every piece that reads it.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "db.example.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PostgresCluster"
PLURAL: Final = "postgresclusters"
SHORT: Final = "pgc"

FIELD_MANAGER: Final = "pg-operator"

# On every child object and every pod; the value is the cluster's name.
CLUSTER_LABEL: Final = "db.example.com/cluster"
# Set on pods by Patroni.
ROLE_LABEL: Final = "role"
ROLE_PRIMARY: Final = "primary"
ROLE_REPLICA: Final = "replica"

# Database roles the operator owns.
SUPERUSER: Final = "postgres"
REPLICATION_USER: Final = "replicator"
# Basic-auth user for Patroni's unsafe REST endpoints (switchover, restart, reload, config).
PATRONI_API_USER: Final = "patroni"
# The monitoring role every instance creates (instance/session_roles.py) for /metrics and the archive report.
MONITOR_ROLE: Final = "pgop_monitor"

# Pod contract with the instance entrypoint.
CONTAINER_NAME: Final = "postgres"
PG_PORT: Final = 5432
PG_PORT_NAME: Final = "postgresql"
PATRONI_PORT: Final = 8008
PATRONI_PORT_NAME: Final = "patroni"
# The instance's /metrics (HTTPS), served by the entrypoint (instance/metrics_server.py).
METRICS_PORT: Final = 9187
METRICS_PORT_NAME: Final = "metrics"
# On the instances' pods: their Patroni serves its REST API over HTTPS. Informational only: the operator
# speaks HTTPS to every pod, verified against the cluster's CA, whatever the pod says (no plain HTTP).
PATRONI_TLS_ANNOTATION: Final = "db.example.com/patroni-api-tls"
# Fencing (docs/lifecycle.md). The operator marks the pods it fences (a pod update also makes the kubelet
# refresh the mounted instance.yaml at once, which lists the fenced instances); the instance answers with
# the time its PostgreSQL stopped, and removes that once it runs PostgreSQL again.
FENCED_ANNOTATION: Final = "db.example.com/fenced"
POSTGRES_STOPPED_ANNOTATION: Final = "db.example.com/postgres-stopped"
CONFIG_MOUNT: Final = "/etc/pg-operator/config"
# spec.monitoring.customQueries: the tenant's ConfigMap key, mounted (optional) as this file; the
# entrypoint's /metrics reads it again when it changes (instance/metrics_custom.py).
CUSTOM_QUERIES_MOUNT: Final = "/etc/pg-operator/custom-queries"
CUSTOM_QUERIES_FILE: Final = "queries.yaml"
INSTANCE_CONFIG_KEY: Final = "instance.yaml"
SECRETS_MOUNT: Final = "/etc/pg-operator/secrets"
# Secret <name>-server-tls: tls.crt, tls.key, ca.crt, replication.crt, replication.key.
TLS_MOUNT: Final = "/etc/pg-operator/tls"
DATA_MOUNT: Final = "/var/lib/postgresql/data"
PGDATA: Final = f"{DATA_MOUNT}/pgdata"
DATA_VOLUME: Final = "data"
POSTGRES_UID: Final = 999
