#!/usr/bin/env bash
# The demo: a real local Kubernetes (full profile), the operator installed in it from deploy/ (its image
# built locally, as a user would run it), the example PostgresCluster, and a query with the app Secret.
# A second run reuses the cluster, the cached images and the objects that exist, so it is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "local Kubernetes (full profile)"
python3 localkube/cluster.py up full
export KUBECONFIG
KUBECONFIG=$(python3 localkube/cluster.py kubeconfig)
bin=$(python3 -c 'import sys; sys.path.insert(0, "localkube"); from common import Context; print(Context().bin)')
kubectl() { "$bin/kubectl" "$@"; }

step "images: PostgreSQL 16 and the operator (built locally, cached by their inputs)"
pg_image=$(.venv/bin/python -c 'from pg_operator.images import default_image; print(default_image("16"))')
python3 localkube/images/build.py --ref "$pg_image" --import
python3 localkube/images/build.py images/operator --import

step "the CRD and the operator, from deploy/"
kubectl apply -k deploy/ >/dev/null
kubectl -n pg-operator-system rollout status deployment/pg-operator --timeout=300s

step "the example cluster: examples/orders-db.yaml"
kubectl apply -f examples/orders-db.yaml
echo "waiting for orders-db to become Ready (first run: initdb and two base backups)…"
kubectl -n shop wait postgrescluster/orders-db --for=condition=Ready --timeout=900s >/dev/null
kubectl -n shop get pgc

step "a query through orders-db-rw with the orders-db-app Secret"
secret() { kubectl -n shop get secret orders-db-app -o "jsonpath={.data.$1}" | base64 -d; }
rw_ip=$(kubectl -n shop get service orders-db-rw -o jsonpath='{.spec.clusterIP}')
PGPASSWORD=$(secret password) PGUSER=$(secret username) PGDATABASE=$(secret dbname) PGHOST=$rw_ip \
  .venv/bin/python - <<'PY'
import os
import psycopg
with psycopg.connect(connect_timeout=10) as conn:
    row = conn.execute("select current_user, current_database(), version(), pg_is_in_recovery()").fetchone()
    print(f"connected as {row[0]} to {row[1]} on the primary (in recovery: {row[3]})\n{row[2]}")
PY
cat <<MSG

Try it yourself:
  export KUBECONFIG=$KUBECONFIG PATH=$bin:\$PATH
  kubectl -n shop get pgc,pods,svc
  kubectl -n shop get secret orders-db-app -o jsonpath='{.data.uri}' | base64 -d
MSG
