#!/usr/bin/env bash
# The demo: a real local Kubernetes (full profile), the operator installed in it from deploy/ (its image
# built locally, as a user would run it), the example PostgresCluster, and a query with the app Secret.
# A second run reuses the cluster, the cached images and the objects that exist, so it is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "local Kubernetes (full profile)"
# Only the binaries the full profile runs: not kwok's fake nodes nor helm, which only the tests use.
export PGOP_BINARIES=${PGOP_BINARIES:-full}
python3 localkube/cluster.py up full
export KUBECONFIG
KUBECONFIG=$(python3 localkube/cluster.py kubeconfig)
bin=$(python3 -c 'from localkube.common import Context; print(Context().bin)')
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
# TLS: the server's certificate is checked against the cluster's CA (the Secret's ca.crt) and the
# Service's name; this machine cannot resolve that name, so libpq connects to hostaddr.
ca=${XDG_CACHE_HOME:-$HOME/.cache}/pg-operator/orders-db-ca.crt
mkdir -p "$(dirname "$ca")" && secret 'ca\.crt' > "$ca"
PGPASSWORD=$(secret password) PGUSER=$(secret username) PGDATABASE=$(secret dbname) \
  PGHOST=orders-db-rw.shop.svc PGHOSTADDR=$rw_ip PGSSLMODE=verify-full PGSSLROOTCERT=$ca \
  .venv/bin/python - <<'PY'
import time
import psycopg
# Ready means the -rw Service's endpoints list the primary; kube-proxy's rules on this machine follow a
# moment later, so a first connection may still be refused: retry it as try_psql below does.
for attempt in range(30):
    try:
        conn = psycopg.connect(connect_timeout=5)
        break
    except psycopg.OperationalError:
        if attempt == 29:
            raise
        time.sleep(2)
with conn:
    row = conn.execute("select current_user, current_database(), version(), pg_is_in_recovery()").fetchone()
    print(f"connected as {row[0]} to {row[1]} on the primary (in recovery: {row[3]})\n{row[2]}")
PY
step "psql through the Services, exactly as printed below"
ro_ip=$(kubectl -n shop get service orders-db-ro -o jsonpath='{.spec.clusterIP}')
app_user=$(secret username) app_db=$(secret dbname)
command -v psql >/dev/null || apt-get install -y -qq postgresql-client >/dev/null
# kube-proxy follows the endpoints a moment after Ready: retry for a while before calling it broken.
try_psql() {
  local addr=$1 what=$2 i
  for i in $(seq 30); do
    if PGPASSWORD=$(secret password) psql "host=$what.shop.svc hostaddr=$addr port=5432 user=$app_user dbname=$app_db sslmode=verify-full sslrootcert=$ca connect_timeout=5" \
        -X -A -t -c "select 'psql to $what: in recovery = ' || pg_is_in_recovery()" 2>/dev/null; then
      return 0
    fi
    sleep 2
  done
  echo "psql to $what ($addr) failed" >&2
  return 1
}
try_psql "$rw_ip" orders-db-rw
try_psql "$ro_ip" orders-db-ro

cat <<MSG

orders-db is Ready. Connect from this machine (kube-proxy routes the Service addresses here):
  export KUBECONFIG=$KUBECONFIG PATH=$bin:\$PATH
  export PGPASSWORD=\$(kubectl -n shop get secret orders-db-app -o jsonpath='{.data.password}' | base64 -d)
  export PGSSLMODE=verify-full PGSSLROOTCERT=$ca   # TLS, the server checked against the cluster's CA
  psql "host=orders-db-rw.shop.svc hostaddr=$rw_ip user=$app_user dbname=$app_db"   # the primary (read-write)
  psql "host=orders-db-ro.shop.svc hostaddr=$ro_ip user=$app_user dbname=$app_db"   # the replicas (read-only)
From a pod in the cluster, the Secret's uri (orders-db-rw.shop.svc:5432):
  kubectl -n shop get secret orders-db-app -o jsonpath='{.data.uri}' | base64 -d
Watch it:
  kubectl -n shop get pgc,pods,svc
  kubectl -n shop describe pgc orders-db
Stop the local cluster: python3 localkube/cluster.py down
MSG
