"""pg-operator: run PostgreSQL clusters on Kubernetes from one custom resource.

Layers, each importing only from the ones above it (tests/unit/test_import_layers.py checks):
  leaves          objects (reads of raw Kubernetes objects), images (major → image), scram (password
                  verifiers), tls_files, tls_server, privileged_sql, pooler_contract, api.constants
  api/            the custom resources' types and validation; the CRDs are generated from them
  specs/, backup/, orchestration/, patroni/
                  pure builders and decisions per capability (specs may wire the others into pods) and the
                  Patroni REST client
  instance/, pooler/
                  the code that runs in the PostgreSQL and pooler pods; the operator never imports it
  controller/     everything that talks to the API server: the watch cache, the reconcile loop, the
                  capability sub-reconcilers and the backup reconcilers
  cli/            the `pg-operator` command
"""
