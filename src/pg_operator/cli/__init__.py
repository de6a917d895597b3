"""The `pg-operator` command: `run` (the operator), `manifests` (generate or check the CRDs).

May import every package; nothing imports it.
"""
