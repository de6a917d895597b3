"""The tenant's own queries on /metrics (spec.monitoring.customQueries): parsing postgres_exporter's
queries.yaml format, its bounds, and the samples made from a query's rows. Pure: no connection, no I/O
(metrics_server.py reads the file and runs the queries).

The file is tenant input: bounded in size, in queries, in metrics per query and in rows per query; every
name must be a Prometheus metric name and must not be one the built-in set serves. A file that breaks a
rule is refused whole (nothing of it is served, the reason is logged and `pgop_custom_queries_invalid` is
1); a query that fails when it runs (syntax, timeout, a missing or non-numeric column) loses its samples
for that scrape and counts in `pgop_custom_query_errors_total{query=...}`.

The format: a mapping of metric-name prefix to {query, metrics: [{column: {usage, description}}], master,
database}. usage LABEL (the column is a label), GAUGE, COUNTER or DISCARD; master: true runs the query on
the primary only; database (default postgres) is where it runs, at most MAX_DATABASES others. Each GAUGE
or COUNTER column is served as `<prefix>_<column>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from pg_operator.instance.metrics import CATALOG, Family

MAX_FILE_BYTES = 64 * 1024
MAX_QUERIES = 32
MAX_METRICS_PER_QUERY = 32
MAX_QUERY_CHARS = 8192
MAX_DESCRIPTION_CHARS = 1024
# Rows one query may return; more is an error for that query (a scrape stays small).
MAX_ROWS = 1000
# Databases other than `postgres` the queries may name: each costs the instance one kept connection.
MAX_DATABASES = 4
DATABASE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
DEFAULT_DATABASE = "postgres"
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Columns are labels or values; a label named like this would be reserved by Prometheus.
RESERVED_LABEL_PREFIX = "__"

ERRORS_FAMILY = "pgop_custom_query_errors_total"
INVALID_FAMILY = "pgop_custom_queries_invalid"
QUERIES_FAMILY = "pgop_custom_queries"
OWN_FAMILIES = (ERRORS_FAMILY, INVALID_FAMILY, QUERIES_FAMILY)
_QUERY_KEYS = frozenset({"query", "metrics", "master", "database"})
_COLUMN_KEYS = frozenset({"usage", "description"})


class Usage(Enum):
    LABEL = "LABEL"
    GAUGE = "GAUGE"
    COUNTER = "COUNTER"
    DISCARD = "DISCARD"


@dataclass(frozen=True)
class Column:
    name: str
    usage: Usage
    description: str


@dataclass(frozen=True)
class CustomQuery:
    prefix: str  # also the query's name in pgop_custom_query_errors_total
    sql: str
    columns: tuple[Column, ...]
    primary_only: bool = False
    database: str = DEFAULT_DATABASE

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.usage is Usage.LABEL)

    @property
    def values(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.usage in (Usage.GAUGE, Usage.COUNTER))

    def family_name(self, column: Column) -> str:
        return f"{self.prefix}_{column.name}"


class QueriesRefused(ValueError):
    """The file breaks a rule; the message names the query and the field."""


def _column(prefix: str, entry: Any) -> Column:
    where = f"{prefix}.metrics"
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise QueriesRefused(f"{where}: each entry must be a mapping of one column name to its usage")
    ((name, body),) = entry.items()
    where = f"{where}.{name}"
    if not isinstance(name, str) or not LABEL_NAME.match(name) or name.startswith(RESERVED_LABEL_PREFIX):
        raise QueriesRefused(
            f"{where}: a column must be named like a Prometheus label ([a-zA-Z_][a-zA-Z0-9_]*)"
        )
    if not isinstance(body, Mapping):
        raise QueriesRefused(f"{where}: expected a mapping with usage and description")
    unknown = sorted(str(k) for k in body if k not in _COLUMN_KEYS)
    if unknown:
        raise QueriesRefused(f"{where}: unknown keys {', '.join(unknown)} (supported: usage, description)")
    usage = body.get("usage")
    try:
        parsed = Usage(str(usage).upper())
    except ValueError:
        allowed = ", ".join(u.value for u in Usage)
        raise QueriesRefused(f"{where}.usage: {usage!r} is not one of {allowed}") from None
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise QueriesRefused(f"{where}.description: text of at most {MAX_DESCRIPTION_CHARS} characters")
    return Column(name, parsed, description)


def _query(prefix: Any, body: Any) -> CustomQuery:
    if not isinstance(prefix, str) or not METRIC_NAME.match(prefix):
        raise QueriesRefused(f"{prefix!r}: a query's name must be a Prometheus metric name prefix")
    if not isinstance(body, Mapping):
        raise QueriesRefused(f"{prefix}: expected a mapping with query and metrics")
    unknown = sorted(str(k) for k in body if k not in _QUERY_KEYS)
    if unknown:
        raise QueriesRefused(
            f"{prefix}: unknown keys {', '.join(unknown)} (supported: query, metrics, master)"
        )
    sql = body.get("query")
    if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_QUERY_CHARS:
        raise QueriesRefused(f"{prefix}.query: a statement of at most {MAX_QUERY_CHARS} characters")
    metrics = body.get("metrics")
    if not isinstance(metrics, list) or not metrics or len(metrics) > MAX_METRICS_PER_QUERY:
        raise QueriesRefused(f"{prefix}.metrics: a list of 1 to {MAX_METRICS_PER_QUERY} columns")
    master = body.get("master", False)
    if not isinstance(master, bool):
        raise QueriesRefused(f"{prefix}.master: true or false")
    database = body.get("database", DEFAULT_DATABASE)
    if not isinstance(database, str) or not DATABASE_NAME.match(database):
        raise QueriesRefused(f"{prefix}.database: a database name (lower-case letters, digits, '_')")
    columns = tuple(_column(prefix, entry) for entry in metrics)
    names = [c.name for c in columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise QueriesRefused(f"{prefix}.metrics: columns named twice: {', '.join(twice)}")
    query = CustomQuery(prefix, sql, columns, master, database)
    if not query.values:
        raise QueriesRefused(f"{prefix}.metrics: no GAUGE or COUNTER column, nothing to serve")
    return query


def parse(text: str | bytes) -> list[CustomQuery]:
    """The queries of a queries.yaml, or QueriesRefused naming what breaks a rule."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_FILE_BYTES:
        raise QueriesRefused(f"the queries file holds {size} bytes; at most {MAX_FILE_BYTES}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise QueriesRefused(f"the queries file is not YAML{where}") from None
    if data is None:
        return []
    if not isinstance(data, Mapping):
        raise QueriesRefused("the queries file must be a mapping of metric-name prefix to query")
    if len(data) > MAX_QUERIES:
        raise QueriesRefused(f"the queries file holds {len(data)} queries; at most {MAX_QUERIES}")
    queries = [_query(prefix, body) for prefix, body in data.items()]
    others = sorted({q.database for q in queries} - {DEFAULT_DATABASE})
    if len(others) > MAX_DATABASES:
        raise QueriesRefused(f"the queries name {len(others)} databases besides {DEFAULT_DATABASE}; at most "
                             f"{MAX_DATABASES}")  # fmt: skip
    taken = {*CATALOG, *OWN_FAMILIES}
    for query in queries:
        for column in query.values:
            family = query.family_name(column)
            if family in taken:
                raise QueriesRefused(
                    f"{query.prefix}.metrics.{column.name}: {family} is already served (built in, or by "
                    "another query)"
                )
            taken.add(family)
    return queries


def samples(query: CustomQuery, rows: Iterable[Mapping[str, Any]]) -> list[Family]:
    """The families of one query's rows; ValueError naming the column when a row lacks one or a value is
    not a number (the query then serves nothing this scrape)."""
    families = {c.name: Family(query.family_name(c), c.usage.value.lower(), c.description or
                               f"{query.prefix} {c.name} (custom query)") for c in query.values}  # fmt: skip
    for row in rows:
        missing = [c.name for c in query.columns if c.usage is not Usage.DISCARD and c.name not in row]
        if missing:
            raise ValueError(f"the query returned no column {', '.join(missing)}")
        labels = {name: "" if row[name] is None else str(row[name]) for name in query.labels}
        for column in query.values:
            value = row[column.name]
            if value is None:
                continue
            if isinstance(value, bool):
                value = int(value)
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"column {column.name} is not a number") from None
            families[column.name].samples.append((labels, number))
    return [f for f in families.values() if f.samples]


def own_families(invalid: bool, loaded: int, errors: Mapping[str, int]) -> list[Family]:
    """What /metrics says about the custom queries themselves."""
    out = [
        Family(INVALID_FAMILY, "gauge", "1 when the custom queries file is refused (the log says why).",
               [({}, float(invalid))]),
        Family(QUERIES_FAMILY, "gauge", "Custom queries loaded.", [({}, float(loaded))]),
    ]  # fmt: skip
    if errors:
        out.append(Family(ERRORS_FAMILY, "counter", "Custom query runs that failed (syntax, timeout, a "
                          "missing or non-numeric column, too many rows).",
                          [({"query": name}, float(n)) for name, n in sorted(errors.items())]))  # fmt: skip
    return out
