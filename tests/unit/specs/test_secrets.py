"""Secrets: CSPRNG passwords, the application's connection keys, and no password in a repr."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from psycopg.conninfo import conninfo_to_dict

from harness.objects import cluster_model as cluster
from pg_operator.specs import APP_SECRET_KEYS, ClusterPasswords, build_secrets, owner_reference, secret_names


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


PASSWORDS = ClusterPasswords(
    superuser="su-pw", replication="repl-pw", app="p@ss:w/rd?&%\\", patroni_api="api-pw"
)


def test_names_and_order() -> None:
    names = ["orders-db-superuser", "orders-db-replication", "orders-db-app", "orders-db-patroni-api"]
    assert secret_names(cluster()) == names
    assert [s["metadata"]["name"] for s in build_secrets(cluster(), PASSWORDS)] == names


def test_superuser_replication_and_patroni_api_secrets() -> None:
    su, repl, _, api = build_secrets(cluster(), PASSWORDS)
    assert decoded(su) == {"username": "postgres", "password": "su-pw"}
    assert decoded(repl) == {"username": "replicator", "password": "repl-pw"}
    assert decoded(api) == {"username": "patroni", "password": "api-pw"}
    for s in (su, repl, api):
        assert s["type"] == "kubernetes.io/basic-auth"
        assert s["metadata"]["ownerReferences"][0]["controller"] is True
        assert "stringData" not in s


def test_app_secret_keys_and_values() -> None:
    app = decoded(build_secrets(cluster(), PASSWORDS)[2])
    assert set(app) == set(APP_SECRET_KEYS)
    assert set(APP_SECRET_KEYS) == {
        "username",
        "user",
        "password",
        "dbname",
        "host",
        "port",
        "uri",
        "jdbc-uri",
        "pgpass",
        "fqdn-host",
        "fqdn-uri",
        "fqdn-jdbc-uri",
    }
    assert app["username"] == app["user"] == "app" and app["dbname"] == "app"
    assert app["password"] == PASSWORDS.app
    assert app["host"] == "orders-db-rw.shop.svc" and app["port"] == "5432"
    assert app["fqdn-host"] == "orders-db-rw.shop.svc.cluster.local"


def test_uris_percent_encode_the_password() -> None:
    app = decoded(build_secrets(cluster(), PASSWORDS)[2])
    for key, host in (("uri", "orders-db-rw.shop.svc"), ("fqdn-uri", "orders-db-rw.shop.svc.cluster.local")):
        parts = urlsplit(app[key])
        assert parts.scheme == "postgresql" and parts.hostname == host and parts.port == 5432
        assert parts.path == "/app" and parts.username == "app"
        assert parts.password is not None and unquote(parts.password) == PASSWORDS.app
        assert "p@ss" not in app[key]
        assert parse_qs(parts.query)["sslmode"] == ["verify-full"]  # TLS, and the server's name checked
    assert app["jdbc-uri"] == (
        "jdbc:postgresql://orders-db-rw.shop.svc:5432/app?user=app&password=p%40ss%3Aw%2Frd%3F%26%25%5C"
        "&sslmode=verify-full&connectTimeout=5&tcpKeepAlive=true&targetServerType=primary"
    )
    assert app["fqdn-jdbc-uri"].startswith("jdbc:postgresql://orders-db-rw.shop.svc.cluster.local:5432/app?")


def test_pgpass_escapes_separators() -> None:
    app = decoded(build_secrets(cluster(), PASSWORDS)[2])
    assert app["pgpass"] == "orders-db-rw.shop.svc:5432:app:app:p@ss\\:w/rd?&%\\\\\n"


def test_app_secret_follows_bootstrap_names() -> None:
    app = decoded(
        build_secrets(cluster(bootstrap={"initdb": {"database": "orders", "owner": "shop"}}), PASSWORDS)[2]
    )
    assert (app["username"], app["dbname"]) == ("shop", "orders")
    assert "@orders-db-rw.shop.svc:5432/orders?sslmode=verify-full&" in app["uri"]


def test_uris_make_libpq_fail_fast_and_refuse_a_standby() -> None:
    """libpq itself parses the URIs (an unknown parameter is an error there), and gets the settings that
    bound how long a vanished primary holds a client."""
    app = decoded(build_secrets(cluster(), PASSWORDS)[2])
    for key in ("uri", "fqdn-uri"):
        params = conninfo_to_dict(app[key])
        assert params["password"] == PASSWORDS.app and params["sslmode"] == "verify-full"
        assert params["target_session_attrs"] == "read-write"
        assert int(params["connect_timeout"]) <= 5 and int(params["tcp_user_timeout"]) <= 5000
        assert params["keepalives"] == "1"
        idle, every, count = (int(params[f"keepalives_{k}"]) for k in ("idle", "interval", "count"))
        assert idle + every * count <= 15  # an idle connection to a dead peer is noticed within 15 s


def test_generated_passwords_are_long_random_and_distinct() -> None:
    a, b = ClusterPasswords.generate(), ClusterPasswords.generate()
    values = [a.superuser, a.replication, a.app, b.superuser, b.replication, b.app]
    assert len(set(values)) == 6
    assert all(len(v) >= 32 for v in values)
    assert all(
        set(v) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for v in values
    )


def test_passwords_never_in_repr_or_str() -> None:
    p = ClusterPasswords.generate()
    for text in (repr(p), str(p), f"{p}", repr([p])):
        for secret in (p.superuser, p.replication, p.app):
            assert secret not in text
    assert "redacted" in repr(p)


def test_every_secret_is_owned_labelled_and_create_ready() -> None:
    for s in build_secrets(cluster(), PASSWORDS):
        meta = s["metadata"]
        assert (s["apiVersion"], s["kind"], meta["namespace"]) == ("v1", "Secret", "shop")
        # The same reference as every other child (spelled out in test_specs_children).
        assert meta["ownerReferences"] == [owner_reference(cluster())]
        assert meta["labels"]["db.example.com/cluster"] == "orders-db"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "pg-operator"
        assert meta["labels"]["app.kubernetes.io/component"] == "credentials"
