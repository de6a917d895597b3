"""The day-2 cluster's custom queries (spec.monitoring.customQueries): the ConfigMap the e2e fixture
creates with the cluster, and the series the monitoring module expects Prometheus to scrape from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.e2e_backup import DAY2_NAME

QUERIES = """\
pg_app_tables:
  query: "SELECT current_user AS role, count(*) AS user_tables FROM pg_catalog.pg_stat_user_tables"
  metrics:
    - role:
        usage: LABEL
        description: "The role the query ran as"
    - user_tables:
        usage: GAUGE
        description: "User tables in the database /metrics reads"
pg_app_broken:
  query: "SELECT 1 AS v FROM no_such_table"
  metrics:
    - v:
        usage: GAUGE
        description: "A query that always fails"
"""


@dataclass(frozen=True)
class CustomQueries:
    name: str
    key: str
    text: str
    served: str  # a family the good query serves
    failing: str  # the query that always fails, by name

    def configmap(self, namespace: str) -> dict[str, Any]:
        metadata = {"name": self.name, "namespace": namespace}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {self.key: self.text}}


DAY2_QUERIES = CustomQueries(f"{DAY2_NAME}-queries", "app-queries.yaml", QUERIES, "pg_app_tables_user_tables",
                             "pg_app_broken")  # fmt: skip
