"""Monitoring against a real Prometheus (full profile): Debian's Prometheus on the host, given the pods
the API server lists (harness/prometheus.py) and deploy/monitoring/prometheus-scrape.yaml, scrapes every
instance's /metrics over verified HTTPS (the cluster's CA, a name its certificate holds) and the
operator's, and evaluates deploy/monitoring/prometheus-rules.yaml (every `for:` shortened to a few seconds
in the test's copy).

On the e2e tier's day-2 cluster (two instances archiving to a store; the `kubectl pgc` module shares it):

- a custom query (spec.monitoring.customQueries) is scraped from both instances, run as the monitoring
  role, and a failing one is counted in pgop_custom_query_errors_total without costing the scrape;
- every query of the dashboard returns data for a live two-instance cluster with archiving and a
  completed base backup (the operator's backup series included);
- a replica whose PostgreSQL is stopped (Patroni paused so it stays down) fires PostgresInstanceDown and
  PostgresReplicaNotStreaming, which resolve once Patroni starts it again;
- the store refusing the cluster's credentials (their permission revoked in the store) fires
  PostgresArchivingFailing, which resolves once it accepts them again.

The cost of a scrape is measured by bench/bench_scrape.py.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from harness.deployed_operator import OPERATOR_NAMESPACE
from harness.e2e_backup import DAY2_NAME, Day2, Moto, archived_after_switch, superuser_sql, wait_backup
from harness.e2e_monitoring import DAY2_QUERIES
from harness.kube import apply_objects, get_json
from harness.local_cluster import Kube
from harness.objects import backup
from harness.pgcluster import connect_app, secret, status, wait_serving
from harness.prometheus import MONITORING, Prometheus, prometheus, rules_with_short_for, scrape_config
from harness.s3 import REGION
from harness.waiting import wait_until

CLUSTER = DAY2_NAME
PGDATA = "/var/lib/postgresql/data/pgdata"
PATRONI_CONFIG = "/var/run/postgresql/patroni.yml"
SHORT_FOR = "6s"
RATE_INTERVAL = "1m"

# Series the dashboard reads that this test's set-up cannot have: a panel target reading one of them is
# excused only while Prometheus holds no series of that name (checked below), so it is required the day
# the series appears.
NO_KUBELET_STATS = "the kubelet is not scraped here, and hostPath volumes have no volume stats"
ABSENT_HERE = {
    "kubelet_volume_stats_available_bytes": NO_KUBELET_STATS,
    "kubelet_volume_stats_capacity_bytes": NO_KUBELET_STATS,
}


def pods(kube: Kube, ns: str, role: str) -> list[str]:
    selector = f"db.example.com/cluster={CLUSTER},role={role}"
    return sorted(p["metadata"]["name"] for p in get_json(kube, "pods", "-n", ns, "-l", selector)["items"])


@pytest.fixture(scope="module")
def ns(day2: Day2) -> str:
    return day2.namespace


@pytest.fixture(scope="module")
def moto(day2: Day2) -> Moto:
    return day2.moto


@pytest.fixture(scope="module")
def monitored(operator: Kube, day2: Day2) -> str:
    """The day-2 cluster serving, WAL archived, a table with rows and a completed base backup (one the
    `kubectl pgc` module took, or one taken here)."""
    ns = day2.namespace
    wait_serving(operator, ns, CLUSTER, 2, 300)
    archived_after_switch(operator, ns, CLUSTER, 240)
    with connect_app(operator, ns, CLUSTER) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    done = [b for b in get_json(operator, "backups.db.example.com", "-n", ns)["items"]
            if (b.get("status") or {}).get("phase") == "Completed"]  # fmt: skip
    if not done:
        apply_objects(operator, backup(f"{CLUSTER}-mon", ns, CLUSTER))
        assert wait_backup(operator, ns, f"{CLUSTER}-mon", 600)["phase"] == "Completed"
    return CLUSTER


@pytest.fixture(scope="module")
def prom(
    operator: Kube, ns: str, monitored: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    ca = work / "ca.crt"
    ca.write_text(secret(operator, ns, f"{monitored}-ca")["ca.crt"])
    tls = {"ca_file": str(ca), "server_name": f"{monitored}-r.{ns}.svc"}  # verified, unlike the default
    namespaces = {"pg-operator-instances": [ns], "pg-operator": [OPERATOR_NAMESPACE]}
    config = scrape_config(namespaces, tls)

    def list_pods(namespace: str) -> list[dict[str, Any]]:
        return list(get_json(operator, "pods", "-n", namespace)["items"])

    with prometheus(work, config, rules_with_short_for(SHORT_FOR), list_pods) as server:

        def scraped() -> bool:
            targets = server.targets()
            instances = [t for t in targets if t["labels"].get("job") == "pg-operator-instances"]
            operators = [t for t in targets if t["labels"].get("job") == "pg-operator"]
            assert len(instances) == 2 and all(t["health"] == "up" for t in instances), instances
            assert operators and all(t["health"] == "up" for t in operators), operators
            return True

        wait_until("Prometheus to scrape both instances and the operator", scraped, 120, 2)
        yield server
        print(f"prometheus log: {server.log}", flush=True)


def test_instances_serve_their_figures_under_the_least_privileged_role(
    operator: Kube, ns: str, monitored: str, prom: Prometheus
) -> None:
    (primary,) = pods(operator, ns, "primary")
    (replica,) = pods(operator, ns, "replica")
    roles = {
        r["metric"]["pod"]: r["value"][1]
        for r in prom.query(f'pg_replication_is_replica{{cluster="{monitored}"}}')
    }
    assert roles == {primary: "0", replica: "1"}
    up = prom.query(f'pg_up{{namespace="{ns}", cluster="{monitored}"}} == 1')
    assert {r["metric"]["pod"] for r in up} == {primary, replica}
    assert {r["metric"]["node"] for r in up} and all(r["metric"]["node"] for r in up)
    query = (
        "SELECT rolsuper::text || ' ' || pg_has_role('pgop_monitor', 'pg_monitor', 'member')::text"
        " FROM pg_roles WHERE rolname = 'pgop_monitor'"
    )
    role = superuser_sql(operator, ns, primary, query)
    assert role == "false true"
    # Patroni's own /metrics stays where it was.
    probe = ("import ssl, urllib.request as u\n"
             "ctx = ssl._create_unverified_context()\n"
             "for url in ('https://127.0.0.1:8008/metrics', 'http://127.0.0.1:8008/metrics'):\n"
             "    try:\n        print(u.urlopen(url, context=ctx, timeout=5).read().decode()); break\n"
             "    except Exception: pass\n")  # fmt: skip
    out = operator.kubectl("exec", "-n", ns, primary, "-c", "postgres", "--", "python3", "-c", probe).stdout
    assert re.search(r"^patroni_primary\{[^}]*\} 1$", out, re.M), out[:500]


def test_a_custom_query_is_scraped_beside_the_built_in_set_and_a_failing_one_is_counted(
    operator: Kube, ns: str, monitored: str, prom: Prometheus
) -> None:
    """spec.monitoring.customQueries (the day-2 cluster's ConfigMap, harness/e2e_monitoring.py): its
    good query served by both instances as the monitoring role, its failing one counted per scrape."""
    pods_served = {*pods(operator, ns, "primary"), *pods(operator, ns, "replica")}

    def served() -> list[dict[str, Any]] | None:
        found = prom.query(f'{DAY2_QUERIES.served}{{namespace="{ns}", cluster="{monitored}"}}')
        return found if {r["metric"]["pod"] for r in found} == pods_served else None

    samples = wait_until(f"{DAY2_QUERIES.served} from both instances", served, 120, 2)
    assert {r["metric"]["role"] for r in samples} == {"pgop_monitor"}
    errors = f'pgop_custom_query_errors_total{{namespace="{ns}", query="{DAY2_QUERIES.failing}"}}'

    def counted() -> bool:
        found = prom.query(errors)
        return {r["metric"]["pod"] for r in found} == pods_served and all(
            float(r["value"][1]) >= 2 for r in found
        )

    wait_until("the failing query counted on both instances", counted, 120, 2)
    # The failing query costs nothing else: every instance is still up, the built-in set served.
    up = prom.query(f'pg_up{{namespace="{ns}", cluster="{monitored}"}} == 1')
    assert {r["metric"]["pod"] for r in up} == pods_served
    assert not prom.query(f'pgop_custom_queries_invalid{{namespace="{ns}"}} == 1')


def dashboard_targets() -> list[tuple[str, str]]:
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def test_every_dashboard_query_returns_data(ns: str, monitored: str, prom: Prometheus) -> None:
    time.sleep(10)  # a few scrapes, so that rates have two samples

    def expand(expr: str) -> str:
        return (expr.replace("$namespace", ns).replace("$cluster", monitored)
                .replace("$__rate_interval", RATE_INTERVAL))  # fmt: skip

    present = {name for name in ABSENT_HERE if prom.query(f"count({name})")}
    empty: list[str] = []
    excused: list[str] = []
    for title, expr in dashboard_targets():
        if prom.query(expand(expr)):
            continue
        reads_absent = [n for n in ABSENT_HERE if n not in present and re.search(rf"\b{n}\b", expr)]
        (excused if reads_absent else empty).append(f"{title}: {expr}")
    print(
        json.dumps({"dashboard targets": len(dashboard_targets()), "empty and excused": excused}), flush=True
    )
    assert empty == []
    # The operator's own backup series (the backup alerts read them) report the completed backup.
    succeeded = prom.query(f'pg_operator_backup_last_succeeded{{namespace="{ns}", cluster="{monitored}"}}')
    assert succeeded and {r["value"][1] for r in succeeded} == {"1"}, succeeded
    finished = prom.query(f'pg_operator_backup_last_success_timestamp_seconds{{cluster="{monitored}"}}')
    assert finished and all(0 < time.time() - float(r["value"][1]) < 3600 for r in finished), finished


@pytest.fixture(scope="module")
def store_admin(moto: Moto) -> Any:
    """An IAM client of a second user with every right, to take the cluster's user's rights away and
    give them back (moto's IAM; the cluster's user cannot restore its own rights once revoked)."""
    iam = boto3.client("iam", endpoint_url=moto.server.endpoint, aws_access_key_id=moto.access_key_id,
                       aws_secret_access_key=moto.secret_access_key, region_name=REGION)  # fmt: skip
    iam.create_user(UserName="store-admin")
    key = iam.create_access_key(UserName="store-admin")["AccessKey"]
    iam.put_user_policy(UserName="store-admin", PolicyName="all", PolicyDocument=ALL)
    return boto3.client("iam", endpoint_url=moto.server.endpoint, aws_access_key_id=key["AccessKeyId"],
                        aws_secret_access_key=key["SecretAccessKey"], region_name=REGION)  # fmt: skip


ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)


def test_a_stopped_replica_fires_the_replica_alerts_until_it_runs_again(
    operator: Kube, ns: str, monitored: str, prom: Prometheus
) -> None:
    (primary,) = pods(operator, ns, "primary")
    (replica,) = pods(operator, ns, "replica")

    def patronictl(*args: str) -> str:
        cmd = ("exec", "-n", ns, primary, "-c", "postgres", "--", "patronictl", "-c", PATRONI_CONFIG, *args)
        return str(operator.kubectl(*cmd).stdout)

    patronictl("pause", "--wait")  # Patroni leaves a stopped PostgreSQL stopped
    try:
        started = time.monotonic()
        operator.kubectl("exec", "-n", ns, replica, "-c", "postgres", "--",
                         "pg_ctl", "-D", PGDATA, "stop", "-m", "fast")  # fmt: skip
        prom.wait_firing("PostgresInstanceDown", 120, namespace=ns, pod=replica)
        prom.wait_firing("PostgresReplicaNotStreaming", 120, namespace=ns, cluster=monitored)
        fired = time.monotonic() - started
    finally:
        patronictl("resume", "--wait")
    prom.wait_resolved("PostgresInstanceDown", 240, namespace=ns, pod=replica)
    prom.wait_resolved("PostgresReplicaNotStreaming", 240, namespace=ns, cluster=monitored)
    resolved = time.monotonic() - started
    print(json.dumps({"measure": "replica alerts", "fired_after_s": round(fired, 1),
                      "resolved_after_s": round(resolved, 1), "for": SHORT_FOR}), flush=True)  # fmt: skip
    assert status(operator, ns, monitored).get("currentPrimary") == primary  # a replica's stop moved nothing


def test_refused_store_credentials_fire_the_archiving_alert_until_accepted_again(
    operator: Kube, ns: str, monitored: str, prom: Prometheus, store_admin: Any
) -> None:
    (primary,) = pods(operator, ns, "primary")
    store_admin.delete_user_policy(UserName="e2e", PolicyName="all")
    try:
        started = time.monotonic()
        superuser_sql(operator, ns, primary, "CREATE TABLE IF NOT EXISTS wal_filler AS SELECT 1 AS x")
        superuser_sql(operator, ns, primary, "SELECT pg_switch_wal()")
        prom.wait_firing("PostgresArchivingFailing", 180, namespace=ns, cluster=monitored, pod=primary)
        fired = time.monotonic() - started
    finally:
        store_admin.put_user_policy(UserName="e2e", PolicyName="all", PolicyDocument=ALL)
    # PostgreSQL's archiver retries the segment within a minute; a new one wakes it at once.
    superuser_sql(operator, ns, primary, "INSERT INTO wal_filler VALUES (2)")
    superuser_sql(operator, ns, primary, "SELECT pg_switch_wal()")
    prom.wait_resolved("PostgresArchivingFailing", 240, namespace=ns, cluster=monitored)
    resolved = time.monotonic() - started
    print(json.dumps({"measure": "archiving alert", "fired_after_s": round(fired, 1),
                      "resolved_after_s": round(resolved, 1), "for": SHORT_FOR}), flush=True)  # fmt: skip
    assert prom.query(f'pg_stat_archiver_failing{{namespace="{ns}", pod="{primary}"}} == 0')
