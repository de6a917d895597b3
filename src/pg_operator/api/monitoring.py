"""Types of `spec.monitoring`: queries of the tenant's own served as metrics next to the built-in set
(docs/monitoring.md#custom-metrics).

The queries live in a ConfigMap of the cluster's namespace, in postgres_exporter's queries.yaml format.
The operator does not read it: the instances mount it (optional, so a missing ConfigMap or key serves
the built-in set alone) and their /metrics parses and bounds it (instance/metrics_custom.py), as it is
the tenant's input to the tenant's own database.
"""

from __future__ import annotations

from pydantic import Field

from pg_operator.api.cluster_sections import DNS_SUBDOMAIN_PATTERN
from pg_operator.api.schema import SpecModel

CONFIG_MAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"


class CustomQueries(SpecModel):
    config_map_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="A ConfigMap in the cluster's namespace holding the queries.",
    )
    key: str = Field(
        "queries.yaml",
        min_length=1,
        max_length=253,
        pattern=CONFIG_MAP_KEY_PATTERN,
        description="The ConfigMap key holding the queries (postgres_exporter's queries.yaml format).",
    )


class MonitoringSpec(SpecModel):
    custom_queries: CustomQueries | None = Field(
        None,
        description=(
            "Queries served as metrics on each instance's /metrics, run with the built-in set's role "
            "(pgop_monitor) and statement timeout; a failing query is counted in "
            "pgop_custom_query_errors_total and never breaks /metrics. Setting or changing the ConfigMap's "
            "name rolls the instances; changes to its content are picked up without a restart."
        ),
    )
