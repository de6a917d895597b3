"""pgbouncer.ini and the auth file from the pod's environment."""

from __future__ import annotations

import pytest

from pg_operator.pooler.config import (
    AUTH_QUERY,
    ConfigError,
    render_auth_file,
    render_ini,
    settings_from_env,
)

ENV = {
    "POOLER_CLUSTER": "orders-db",
    "POOLER_SIDE": "rw",
    "POOLER_MODE": "transaction",
    "POOLER_TARGET_HOST": "orders-db-rw.shop.svc",
    "POOLER_AUTH_PASSWORD_FILE": "/etc/pg-operator/pooler-auth/password",
}


def ini_settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            out[k] = v
    return out


def test_defaults_from_a_minimal_environment() -> None:
    s = settings_from_env(ENV)
    assert (s.cluster, s.side, s.mode) == ("orders-db", "rw", "transaction")
    assert s.target == "orders-db-rw.shop.svc"
    assert (s.default_pool_size, s.max_client_conn, s.server_port) == (20, 1000, 5432)
    assert s.max_prepared_statements == 200
    assert s.socket == "/run/pooler/.s.PGSQL.5432"


def test_the_ini_points_every_database_at_the_target_over_verified_tls() -> None:
    s = settings_from_env({**ENV, "POOLER_DEFAULT_POOL_SIZE": "7", "POOLER_MAX_CLIENT_CONN": "300"})
    text = render_ini(s, "orders-db-1.orders-db.shop.svc")
    conf = ini_settings(text)
    assert text.startswith("[databases]\n* = host=orders-db-1.orders-db.shop.svc port=5432\n")
    assert conf["server_tls_sslmode"] == "verify-full"
    assert conf["server_tls_ca_file"] == "/etc/pg-operator/tls/ca.crt"
    assert conf["client_tls_sslmode"] == "require"
    assert conf["client_tls_cert_file"] == "/etc/pg-operator/tls/tls.crt"
    assert conf["auth_type"] == "scram-sha-256"
    assert conf["auth_user"] == "pgop_pooler"
    assert conf["auth_query"] == AUTH_QUERY == "SELECT usename, passwd FROM pgop_pooler.user_lookup($1)"
    assert (conf["pool_mode"], conf["default_pool_size"]) == ("transaction", "7")
    assert conf["max_client_conn"] == "300"
    assert conf["server_login_retry"] == "1"  # not PgBouncer's 15 s after a failed login


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("POOLER_MODE", "statement", "POOLER_MODE"),
        ("POOLER_SIDE", "rx", "POOLER_SIDE"),
        ("POOLER_DEFAULT_POOL_SIZE", "lots", "POOLER_DEFAULT_POOL_SIZE"),
        ("POOLER_MAX_CLIENT_CONN", "0", "POOLER_MAX_CLIENT_CONN"),
        ("POOLER_MAX_PREPARED_STATEMENTS", "-1", "POOLER_MAX_PREPARED_STATEMENTS"),
        ("POOLER_MAX_PREPARED_STATEMENTS", "10001", "POOLER_MAX_PREPARED_STATEMENTS"),
        ("POOLER_TARGET_HOST", "a host; evil=1", "POOLER_TARGET_HOST"),
        ("POOLER_CLUSTER", "", "POOLER_CLUSTER"),
    ],
)
def test_a_bad_environment_is_refused_naming_the_variable(key: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        settings_from_env({**ENV, key: value})


def test_protocol_level_prepared_statements_are_on_by_default_and_settable() -> None:
    """Drivers that prepare statements by default (psycopg 3, asyncpg, pgx, JDBC) need PgBouncer to track
    them in transaction mode; 0 turns that off."""
    assert ini_settings(render_ini(settings_from_env(ENV), "h"))["max_prepared_statements"] == "200"
    for value in ("0", "50"):
        s = settings_from_env({**ENV, "POOLER_MAX_PREPARED_STATEMENTS": value})
        assert ini_settings(render_ini(s, "h"))["max_prepared_statements"] == value


def test_a_target_cannot_inject_settings() -> None:
    s = settings_from_env(ENV)
    with pytest.raises(ConfigError):
        render_ini(s, "h port=1 user=postgres")
    with pytest.raises(ConfigError):
        render_ini(s, "h\nadmin_users = x")


def test_the_auth_file_holds_only_the_auth_role_quoted() -> None:
    assert render_auth_file("pgop_pooler", 'pa"ss') == '"pgop_pooler" "pa""ss"\n'
    with pytest.raises(ConfigError):
        render_auth_file("pgop_pooler", "two\nlines")
    with pytest.raises(ConfigError):
        render_auth_file("pgop_pooler", "")
