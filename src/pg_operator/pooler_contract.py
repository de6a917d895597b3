"""The contract between the pooler's Deployment, built by the operator (`specs/pooler.py`), and the
supervisor that runs in its pods (`pooler/`): the ports, the environment variables the pod is given, and
the auth role, schema and function PgBouncer's `auth_query` calls. A leaf: the standard library only, so
the pod imports it without pydantic and the operator's builders without the pod's code. Change a value
only together with both ends (docs/pooler.md)."""

from __future__ import annotations

from typing import Final

POOLER_PORT: Final = 5432
POOLER_METRICS_PORT: Final = 9127  # pgbouncer_exporter's usual port

ENV_CLUSTER: Final = "POOLER_CLUSTER"
ENV_SIDE: Final = "POOLER_SIDE"
ENV_MODE: Final = "POOLER_MODE"
ENV_TARGET: Final = "POOLER_TARGET_HOST"  # where a fresh pod points: the cluster's -rw (or -ro) Service
ENV_DEFAULT_POOL_SIZE: Final = "POOLER_DEFAULT_POOL_SIZE"
ENV_MAX_CLIENT_CONN: Final = "POOLER_MAX_CLIENT_CONN"
ENV_MAX_PREPARED_STATEMENTS: Final = "POOLER_MAX_PREPARED_STATEMENTS"
ENV_AUTH_USER: Final = "POOLER_AUTH_USER"
ENV_AUTH_PASSWORD_FILE: Final = "POOLER_AUTH_PASSWORD_FILE"  # noqa: S105 - a variable's name
ENV_TLS_DIR: Final = "POOLER_TLS_DIR"
ENV_RUN_DIR: Final = "POOLER_RUN_DIR"
ENV_SERVER_PORT: Final = "POOLER_SERVER_PORT"

AUTH_USER: Final = "pgop_pooler"
# The schema and function every served database holds (specs/pooler.py creates them).
AUTH_SCHEMA: Final = "pgop_pooler"
AUTH_FUNCTION: Final = f"{AUTH_SCHEMA}.user_lookup"
DEFAULT_RUN_DIR: Final = "/run/pooler"
DEFAULT_TLS_DIR: Final = "/etc/pg-operator/tls"
