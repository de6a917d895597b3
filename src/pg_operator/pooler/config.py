"""pgbouncer.ini and the auth file, rendered from the pod's environment (pure: a Settings in, text out).

The environment is the contract with the Deployment the operator builds (specs/pooler.py): `ENV_*`
names below. The server side is always TLS `verify-full` against the cluster's CA; the client side
requires TLS with the cluster's server certificate (which covers the pooler's Service names). Users log in
with SCRAM against the verifier PgBouncer reads through `auth_query`, as the least-privileged auth role,
from a SECURITY DEFINER function in the database the client names (docs/pooler.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# The standard library only, in every module the pod runs: pydantic alone would double the supervisor's
# memory (a pooler pod asks for 64Mi). The names the Deployment sets are in the contract (a leaf).
from pg_operator.pooler_contract import (
    AUTH_FUNCTION,
    AUTH_USER,
    DEFAULT_RUN_DIR,
    DEFAULT_TLS_DIR,
    ENV_AUTH_PASSWORD_FILE,
    ENV_AUTH_USER,
    ENV_CLUSTER,
    ENV_DEFAULT_POOL_SIZE,
    ENV_MAX_CLIENT_CONN,
    ENV_MAX_PREPARED_STATEMENTS,
    ENV_MODE,
    ENV_RUN_DIR,
    ENV_SERVER_PORT,
    ENV_SIDE,
    ENV_TARGET,
    ENV_TLS_DIR,
    POOLER_PORT,
)

AUTH_QUERY = f"SELECT usename, passwd FROM {AUTH_FUNCTION}($1)"  # noqa: S608 - constants only
DEFAULT_POOL_SIZE = 20
DEFAULT_MAX_CLIENT_CONN = 1000
# Protocol-level prepared statements in transaction mode (PgBouncer >= 1.21): PgBouncer prepares a client's
# statement on whichever server connection runs the client's transaction, keeping up to this many on each
# server connection, so drivers that prepare by default (psycopg 3, asyncpg, pgx, JDBC) work through the
# pooler. 0 turns it off. Kept in step with api/pooler.py's bounds.
DEFAULT_MAX_PREPARED_STATEMENTS = 200
MAX_PREPARED_STATEMENTS = 10000
TARGET_FILE = "target"  # in the run dir: the host the pooler points at now
PAUSE_DEADLINE_FILE = "pause-deadline"  # in the run dir: when the watchdog resumes a pause (epoch seconds)
INI_FILE = "pgbouncer.ini"
AUTH_FILE = "userlist.txt"
MODES = ("transaction", "session")


class ConfigError(ValueError):
    """The environment does not describe a pooler."""


@dataclass(frozen=True)
class Settings:
    cluster: str
    side: str
    mode: str
    target: str
    auth_user: str = AUTH_USER
    auth_password_file: str = ""
    default_pool_size: int = DEFAULT_POOL_SIZE
    max_client_conn: int = DEFAULT_MAX_CLIENT_CONN
    max_prepared_statements: int = DEFAULT_MAX_PREPARED_STATEMENTS
    tls_dir: str = DEFAULT_TLS_DIR
    run_dir: str = DEFAULT_RUN_DIR
    port: int = POOLER_PORT
    server_port: int = 5432
    extra: Mapping[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    @property
    def socket(self) -> str:
        return os.path.join(self.run_dir, f".s.PGSQL.{self.port}")


def _int(env: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{key} must be between {low} and {high}, not {value}")
    return value


def _host(value: str, what: str) -> str:
    host = value.strip()
    if not host or any(not (c.isalnum() or c in "-.") for c in host) or len(host) > 253:
        raise ConfigError(f"{what} must be a DNS name, not {value!r}")
    return host


def settings_from_env(env: Mapping[str, str]) -> Settings:
    cluster = env.get(ENV_CLUSTER, "").strip()
    if not cluster:
        raise ConfigError(f"{ENV_CLUSTER} is not set")
    mode = env.get(ENV_MODE, "transaction").strip() or "transaction"
    if mode not in MODES:
        raise ConfigError(f"{ENV_MODE} must be one of {', '.join(MODES)}, not {mode!r}")
    side = env.get(ENV_SIDE, "rw").strip() or "rw"
    if side not in ("rw", "ro"):
        raise ConfigError(f"{ENV_SIDE} must be rw or ro, not {side!r}")
    return Settings(
        cluster=cluster,
        side=side,
        mode=mode,
        target=_host(env.get(ENV_TARGET, ""), ENV_TARGET),
        auth_user=env.get(ENV_AUTH_USER, AUTH_USER).strip() or AUTH_USER,
        auth_password_file=env.get(ENV_AUTH_PASSWORD_FILE, "").strip(),
        default_pool_size=_int(env, ENV_DEFAULT_POOL_SIZE, DEFAULT_POOL_SIZE, 1, 10000),
        max_client_conn=_int(env, ENV_MAX_CLIENT_CONN, DEFAULT_MAX_CLIENT_CONN, 1, 100000),
        max_prepared_statements=_int(
            env, ENV_MAX_PREPARED_STATEMENTS, DEFAULT_MAX_PREPARED_STATEMENTS, 0, MAX_PREPARED_STATEMENTS
        ),
        tls_dir=env.get(ENV_TLS_DIR, DEFAULT_TLS_DIR).strip() or DEFAULT_TLS_DIR,
        run_dir=env.get(ENV_RUN_DIR, DEFAULT_RUN_DIR).strip() or DEFAULT_RUN_DIR,
        server_port=_int(env, ENV_SERVER_PORT, 5432, 1, 65535),
    )


def check_target(host: str) -> str:
    return _host(host, "the target host")


def render_ini(s: Settings, target: str) -> str:
    """pgbouncer.ini pointing every database at `target` (the wildcard entry: a client's database name is
    the server's)."""
    tls = s.tls_dir
    lines = [
        "[databases]",
        f"* = host={check_target(target)} port={s.server_port}",
        "",
        "[pgbouncer]",
        "listen_addr = *",
        f"listen_port = {s.port}",
        f"unix_socket_dir = {s.run_dir}",
        "unix_socket_mode = 0700",
        "auth_type = scram-sha-256",
        f"auth_file = {s.path(AUTH_FILE)}",
        f"auth_user = {s.auth_user}",
        f"auth_query = {AUTH_QUERY}",
        f"pool_mode = {s.mode}",
        f"default_pool_size = {s.default_pool_size}",
        f"max_client_conn = {s.max_client_conn}",
        f"max_prepared_statements = {s.max_prepared_statements}",
        # JDBC and some drivers send these at startup; PgBouncer refuses unknown ones otherwise.
        "ignore_startup_parameters = extra_float_digits,options,search_path",
        # Retry a failed server login after 1 s, not 15: after a failover the new primary is there at once.
        "server_login_retry = 1",
        "server_connect_timeout = 5",
        "dns_max_ttl = 5",
        # A paused or re-pointing pooler holds queries this long before failing them.
        "query_wait_timeout = 120",
        "client_tls_sslmode = require",
        f"client_tls_cert_file = {tls}/tls.crt",
        f"client_tls_key_file = {tls}/tls.key",
        f"client_tls_ca_file = {tls}/ca.crt",
        "server_tls_sslmode = verify-full",
        f"server_tls_ca_file = {tls}/ca.crt",
        "server_tls_protocols = secure",
        "client_tls_protocols = secure",
        # Logs go to stderr (the container log); no pidfile, no syslog.
        "logfile =",
        "syslog = 0",
        "log_connections = 0",
        "log_disconnections = 0",
        "stats_period = 60",
        "application_name_add_host = 0",
    ]
    lines += [f"{k} = {v}" for k, v in sorted(s.extra.items())]
    return "\n".join(lines) + "\n"


def _quoted(value: str) -> str:
    # The auth file's quoting: a double quote inside a field is doubled.
    return '"' + value.replace('"', '""') + '"'


def render_auth_file(user: str, password: str) -> str:
    """The auth file: only the auth role, with its password (PgBouncer logs in as it to run auth_query;
    every other user's verifier comes from the database)."""
    if "\n" in password or "\0" in password or not password:
        raise ConfigError("the auth role's password must be one non-empty line")
    return f"{_quoted(user)} {_quoted(password)}\n"
