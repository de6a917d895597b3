"""The API: typed models of the PostgresCluster, Backup and ScheduledBackup kinds and of instance.yaml,
their validation, the values their schemas are built from, and the CRDs generated from them.

Types and validation only. It imports pydantic and, of pg_operator, only the leaves `objects`, `images`
and `api.constants`; `backup`, `specs`, `instance`, `orchestration` and `controller` import it, never the
other way round (tests/unit/test_import_layers.py).
"""
