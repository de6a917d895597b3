"""pg-operator: run PostgreSQL clusters on Kubernetes from one custom resource."""
