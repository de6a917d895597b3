"""The pooler's children, its auth SQL and where its pods should point (specs/pooler.py)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.specs.network_policy import DEFAULT_OPERATOR_PEER, network_policy
from pg_operator.specs.pooler import (
    PoolerPod,
    auth_secret,
    children,
    desired_target,
    pooler_pods,
    ready_pods,
    setup_sql,
    setup_trigger,
    status_condition,
    teardown_sql,
    to_point,
)
from pg_operator.specs.secrets import connection_keys
from pg_operator.specs.tls import server_dns_names


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_no_pooler_no_children() -> None:
    assert children(cluster()) == []


def test_rw_side_by_default_with_a_budget_and_a_policy() -> None:
    got = by_kind(children(cluster(pooler={})))
    assert set(got) == {
        ("Deployment", "orders-db-pooler-rw"),
        ("Service", "orders-db-pooler-rw"),
        ("PodDisruptionBudget", "orders-db-pooler-rw"),
        ("NetworkPolicy", "orders-db-pooler"),
    }
    for obj in got.values():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert obj["metadata"]["labels"][CLUSTER_LABEL] == "orders-db"
    deployment = got[("Deployment", "orders-db-pooler-rw")]
    pod = deployment["spec"]["template"]
    # Never the cluster label on pooler pods: the instances' Services and the pod cache select on it.
    assert CLUSTER_LABEL not in pod["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert got[("Service", "orders-db-pooler-rw")]["spec"]["selector"] == selector
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["POOLER_TARGET_HOST"] == "orders-db-rw.shop.svc"
    assert env["POOLER_MODE"] == "transaction"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
    tls = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")["secret"]
    # The server certificate and its key, never the replication client key of the same Secret.
    assert tls["secretName"] == "orders-db-server-tls"
    assert {i["key"] for i in tls["items"]} == {"tls.crt", "tls.key", "ca.crt"}


def test_read_only_side_one_instance_no_budget_and_settings() -> None:
    c = cluster(
        pooler={
            "instances": 1,
            "readOnly": True,
            "mode": "session",
            "defaultPoolSize": 5,
            "maxClientConnections": 50,
            "maxPreparedStatements": 0,
            "resources": {"requests": {"cpu": "10m"}},
        }
    )
    got = by_kind(children(c))
    assert ("Deployment", "orders-db-pooler-ro") in got and ("Service", "orders-db-pooler-ro") in got
    assert not any(kind == "PodDisruptionBudget" for kind, _ in got)
    env = {
        e["name"]: e["value"]
        for e in got[("Deployment", "orders-db-pooler-ro")]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["POOLER_TARGET_HOST"] == "orders-db-ro.shop.svc"
    assert env["POOLER_MAX_PREPARED_STATEMENTS"] == "0"
    assert (env["POOLER_MODE"], env["POOLER_DEFAULT_POOL_SIZE"], env["POOLER_MAX_CLIENT_CONN"]) == (
        "session",
        "5",
        "50",
    )


def test_the_policies_admit_clients_to_the_pooler_and_the_pooler_to_the_instances() -> None:
    peer = [{"podSelector": {"matchLabels": {"app": "shop-api"}}}]
    c = cluster(pooler={}, networkPolicy={"allowFrom": peer})
    pooler_policy = by_kind(children(c))[("NetworkPolicy", "orders-db-pooler")]
    assert pooler_policy["spec"]["ingress"][0] == {"from": peer, "ports": [{"protocol": "TCP", "port": 5432}]}
    instances = network_policy(c, DEFAULT_OPERATOR_PEER)
    assert instances is not None
    pg_from = instances["spec"]["ingress"][0]["from"]
    assert {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "pgbouncer", "db.example.com/pooler": "orders-db"}
        }
    } in pg_from
    off = network_policy(cluster(networkPolicy={"allowFrom": peer}), DEFAULT_OPERATOR_PEER)
    assert off is not None and len(off["spec"]["ingress"][0]["from"]) == len(pg_from) - 1
    assert ("NetworkPolicy", "orders-db-pooler") not in by_kind(
        children(cluster(pooler={}, networkPolicy={"enabled": False}))
    )


def test_connection_keys_through_the_pooler_only_when_it_is_on() -> None:
    keys = connection_keys(cluster(pooler={}), "app", "app", "p@ss")
    assert keys["pgbouncer-host"] == "orders-db-pooler-rw.shop.svc"
    assert keys["pgbouncer-port"] == "5432"
    assert keys["pgbouncer-uri"].startswith(
        "postgresql://app:p%40ss@orders-db-pooler-rw.shop.svc:5432/app?sslmode=verify-full&"
    )
    assert "target_session_attrs" not in keys["pgbouncer-uri"]
    assert "?user=app&password=p%40ss&sslmode=verify-full&connectTimeout=5" in keys["pgbouncer-jdbc-uri"]
    assert not any(k.startswith("pgbouncer") for k in connection_keys(cluster(), "app", "app", "x"))


def test_the_server_certificate_covers_the_pooler_services() -> None:
    sans = server_dns_names(cluster())
    for side in ("rw", "ro"):
        svc = f"orders-db-pooler-{side}"
        assert {svc, f"{svc}.shop", f"{svc}.shop.svc", f"{svc}.shop.svc.cluster.local"} <= set(sans)


def test_auth_secret_and_sql() -> None:
    secret = auth_secret(cluster(pooler={}), "pw")
    assert secret["metadata"]["name"] == "orders-db-pooler-auth"
    sql = setup_sql("pw", ["app", "template1", "postgres", "app"], salt=b"0123456789abcdef")
    assert "PASSWORD 'SCRAM-SHA-256$4096:" in sql and "'pw'" not in sql
    assert "NOSUPERUSER" in sql and "NOREPLICATION" in sql and "NOBYPASSRLS" in sql
    assert sql.count("\\connect ") == 3  # each database once
    assert "SECURITY DEFINER" in sql and "NOT a.rolsuper AND NOT a.rolreplication" in sql
    assert "REVOKE ALL ON FUNCTION pgop_pooler.user_lookup(text) FROM PUBLIC" in sql
    with pytest.raises(ValueError):
        setup_sql("pw", ["bad'name"])


def test_setup_trigger_moves_with_primary_secret_and_databases() -> None:
    c = cluster(pooler={})
    secret = {"metadata": {"uid": "s1", "resourceVersion": "5"}}
    base = setup_trigger(c, "orders-db-0", secret, ["app"])
    assert base == setup_trigger(c, "orders-db-0", secret, ["app"])
    assert base != setup_trigger(c, "orders-db-1", secret, ["app"])
    newer = {"metadata": {"uid": "s1", "resourceVersion": "6"}}
    assert base != setup_trigger(c, "orders-db-0", newer, ["app"])
    assert base != setup_trigger(c, "orders-db-0", secret, ["app", "reports"])


def meta(name: str, side: str, points_to: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "labels": {"db.example.com/pooler": "orders-db", "db.example.com/pooler-side": side},
    }
    if points_to is not None:
        out["annotations"] = {"db.example.com/pooler-points-to": points_to}
    return {**out, **extra}


def test_which_pods_to_point_and_where() -> None:
    c = cluster(pooler={"readOnly": True})
    primary_host = "orders-db-1.orders-db.shop.svc"
    pods = pooler_pods(
        "orders-db",
        [
            meta("rw-a", "rw"),  # fresh: points at -rw
            meta("rw-b", "rw", primary_host),  # already there
            meta("rw-c", "rw", "orders-db-0.orders-db.shop.svc"),  # the old primary
            meta("ro-a", "ro"),  # fresh ro: at -ro already
            meta("going", "rw", deletionTimestamp="2026-01-01T00:00:00Z"),
            {"name": "other", "labels": {"db.example.com/pooler": "another-db"}},
        ],
    )
    assert [p.name for p in pods] == ["ro-a", "rw-a", "rw-b", "rw-c"]
    assert to_point(c, pods, "orders-db-1") == [("rw-a", primary_host), ("rw-c", primary_host)]
    assert to_point(c, pods, None) == []  # no primary known: leave them where they are
    assert desired_target(c, "ro", None) == "orders-db-ro.shop.svc"


def test_status_condition() -> None:
    c = cluster(pooler={"instances": 2})

    def deployment(name: str, generation: int, **status: int) -> dict[str, Any]:
        return {"metadata": {"name": name, "generation": generation}, "status": status}

    done = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}
    assert (
        ready_pods(c, [deployment("orders-db-pooler-rw", 2, **done), deployment("unrelated", 1, **done)]) == 2
    )
    # Rolling out: the old pods still serve, or the controller has not seen the new template.
    rolling = {**done, "replicas": 3, "updatedReplicas": 1}
    assert ready_pods(c, [deployment("orders-db-pooler-rw", 2, **rolling)]) == 0
    assert ready_pods(c, [deployment("orders-db-pooler-rw", 3, **done)]) == 0
    assert status_condition(c, 1, 0, "orders-db-0", None)[:2] == (False, "PoolerStarting")
    assert status_condition(c, 2, 0, None, None)[:2] == (False, "PoolerWaiting")
    assert status_condition(c, 2, 1, "orders-db-0", None)[:2] == (False, "PoolerPointing")
    ok, reason, message = status_condition(c, 2, 2, "orders-db-0", None)
    assert (ok, reason) == (True, "PoolerReady") and "orders-db-0.orders-db.shop.svc" in message
    assert status_condition(c, 2, 2, "orders-db-0", "boom") == (False, "PoolerProblem", "boom")


def test_pooler_pod_record() -> None:
    assert pooler_pods("orders-db", [meta("a", "rw", "h")]) == [PoolerPod("a", "rw", "h")]


def test_the_pooler_keys_leave_the_connection_secrets_with_the_pooler() -> None:
    import base64

    from pg_operator.specs.roles import stale_keys
    from pg_operator.specs.secrets import gone_keys

    def b64(v: str) -> str:
        return base64.b64encode(v.encode()).decode()

    on = cluster(pooler={}, roles=[{"name": "shopper"}])
    keys = connection_keys(on, "shopper", "app", "pw")
    secret = {"metadata": {"resourceVersion": "3"}, "data": {k: b64(v) for k, v in keys.items()}}
    assert stale_keys(on, "shopper", secret, None) is None  # all there
    off = cluster(roles=[{"name": "shopper"}])
    patch = stale_keys(off, "shopper", secret, None)
    assert patch is not None
    assert patch["data"] == {
        "pgbouncer-host": None,
        "pgbouncer-port": None,
        "pgbouncer-uri": None,
        "pgbouncer-jdbc-uri": None,
    }
    assert gone_keys(on, secret["data"]) == {}


def test_teardown_sql_undoes_the_setup_in_every_database_then_drops_the_role() -> None:
    sql = teardown_sql(["app", "template1", "app"])
    assert sql.count("\\connect ") == 2
    assert sql.count('DROP SCHEMA IF EXISTS "pgop_pooler" CASCADE;') == 2
    assert sql.index('DROP ROLE IF EXISTS "pgop_pooler";') > sql.rindex("DROP SCHEMA")
    with pytest.raises(ValueError):
        teardown_sql(["bad'name"])
