"""Credentials: Secrets `<name>-superuser`, `<name>-replication`, `<name>-app` and `<name>-patroni-api`
(basic auth for Patroni's unsafe REST endpoints, which the operator uses for switchovers).

The controller creates the missing ones with fresh passwords and never writes a password into one: a
password is generated once per Secret, and what the Secret holds is what the role gets
(credential_changes.py; the app Secret's derived keys and `ca.crt` are kept up to date). No password ever
appears in a repr, a log line or an Event.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import PATRONI_API_USER, PG_PORT, REPLICATION_USER, SUPERUSER
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_CREDENTIALS, child_metadata

APP_SSLMODE = "verify-full"

# A vanished primary must cost a client seconds, not TCP's minutes of retransmission (docs/connecting.md):
# a connect gives up after 5 s, a connection whose peer stops acknowledging is dropped after 5 s, an idle
# one is probed after 5 s; and through `-rw` a connection that reached an instance in recovery is refused
# (PostgreSQL ≥ 14 reports it at login, no extra query), so a pool never keeps a read-only session.
LIBPQ_FAST_FAIL = ("connect_timeout=5&keepalives=1&keepalives_idle=5&keepalives_interval=2&keepalives_count=3"
                   "&tcp_user_timeout=5000")  # fmt: skip
LIBPQ_READ_WRITE = "target_session_attrs=read-write"
# pgJDBC has no per-connection keepalive timing or user timeout; it takes the connect timeout (seconds),
# keepalives with the operating system's timing, and refuses a standby.
JDBC_FAST_FAIL = "connectTimeout=5&tcpKeepAlive=true"
JDBC_READ_WRITE = "targetServerType=primary"

# 32 random bytes, URL-safe base64: 43 characters, 256 bits.
PASSWORD_BYTES = 32

APP_SECRET_KEYS = (
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
)
# Added by the TLS sub-reconciler once the cluster's CA exists (controller/reconcilers/tls.py).
APP_CA_KEY = "ca.crt"


def _password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


@dataclass(frozen=True)
class ClusterPasswords:
    """The passwords of a cluster. Its repr names no password."""

    superuser: str = field(repr=False)
    replication: str = field(repr=False)
    app: str = field(repr=False)
    patroni_api: str = field(repr=False)

    @classmethod
    def generate(cls) -> ClusterPasswords:
        return cls(superuser=_password(), replication=_password(), app=_password(), patroni_api=_password())

    def __repr__(self) -> str:
        return (
            "ClusterPasswords(superuser=<redacted>, replication=<redacted>, app=<redacted>, "
            "patroni_api=<redacted>)"
        )

    __str__ = __repr__


def decoded(secret: Mapping[str, Any] | None, key: str) -> str | None:
    """One key of a Secret as the cache holds it (the API server has turned any stringData into data);
    None when absent or not base64-encoded UTF-8."""
    raw = ((secret or {}).get("data") or {}).get(key)
    if raw is None:
        return None
    try:
        return base64.b64decode(str(raw), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def secret_names(cluster: PostgresCluster) -> list[str]:
    return [
        names.superuser_secret(cluster),
        names.replication_secret(cluster),
        names.app_secret(cluster),
        names.patroni_api_secret(cluster),
    ]


def _pgpass_field(value: str) -> str:
    # .pgpass separates fields with ':' and escapes ':' and '\' with a backslash.
    return value.replace("\\", "\\\\").replace(":", "\\:")


def app_connection(cluster: PostgresCluster, password: str) -> dict[str, str]:
    """Everything an application needs to connect, as CloudNativePG users expect it."""
    init = cluster.spec.bootstrap.initdb
    return connection_keys(cluster, init.owner, init.database, password)


def connection_keys(cluster: PostgresCluster, user: str, dbname: str, password: str) -> dict[str, str]:
    """The keys of a connection Secret through `-rw` (`<cluster>-app` and every generated role Secret)."""
    host = names.rw_host(cluster)
    fqdn = names.rw_fqdn(cluster)
    port = str(PG_PORT)
    pw = quote(password, safe="")
    u = quote(user, safe="")
    db = quote(dbname, safe="")

    # TLS always, and the server's name checked against the cluster's CA (key `ca.crt`; libpq and the JDBC
    # driver read it from ~/.postgresql/root.crt unless `sslrootcert` says otherwise, docs/tls.md).
    def uri(h: str) -> str:
        return f"postgresql://{u}:{pw}@{h}:{port}/{db}?sslmode={APP_SSLMODE}&{LIBPQ_FAST_FAIL}&{LIBPQ_READ_WRITE}"

    def jdbc(h: str) -> str:
        return (f"jdbc:postgresql://{h}:{port}/{db}?user={u}&password={pw}&sslmode={APP_SSLMODE}"
                f"&{JDBC_FAST_FAIL}&{JDBC_READ_WRITE}")  # fmt: skip

    pgpass = ":".join(_pgpass_field(v) for v in (host, port, dbname, user, password)) + "\n"
    pooler: dict[str, str] = {}
    if cluster.spec.pooler is not None:
        # Through the pooler's read-write side (docs/pooler.md): the same TLS, the same CA, the same fast
        # failure; no session check, as the pooler's `-rw` side only ever points at the primary.
        bouncer = f"{cluster.name}-pooler-rw.{cluster.namespace}.svc"
        pooler = {"pgbouncer-host": bouncer, "pgbouncer-port": port,
                  "pgbouncer-uri": (f"postgresql://{u}:{pw}@{bouncer}:{port}/{db}?sslmode={APP_SSLMODE}"
                                    f"&{LIBPQ_FAST_FAIL}"),
                  "pgbouncer-jdbc-uri": (f"jdbc:postgresql://{bouncer}:{port}/{db}?user={u}&password={pw}"
                                         f"&sslmode={APP_SSLMODE}&{JDBC_FAST_FAIL}")}  # fmt: skip
    return {
        **pooler,
        "username": user,
        "user": user,
        "password": password,
        "dbname": dbname,
        "host": host,
        "port": port,
        "uri": uri(host),
        "jdbc-uri": jdbc(host),
        "pgpass": pgpass,
        "fqdn-host": fqdn,
        "fqdn-uri": uri(fqdn),
        "fqdn-jdbc-uri": jdbc(fqdn),
    }


POOLER_KEYS = ("pgbouncer-host", "pgbouncer-port", "pgbouncer-uri", "pgbouncer-jdbc-uri")


def gone_keys(cluster: PostgresCluster, data: Mapping[str, Any]) -> dict[str, None]:
    """Keys a connection Secret holds that connection_keys no longer gives (the pooler's, once it is
    off), as a merge patch's removals."""
    if cluster.spec.pooler is not None:
        return {}
    return {k: None for k in POOLER_KEYS if k in data}


def _secret(cluster: PostgresCluster, name: str, values: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(cluster, name, COMPONENT_CREDENTIALS),
        # basic-auth: tools recognise username/password; further keys are allowed.
        "type": "kubernetes.io/basic-auth",
        "data": {k: base64.b64encode(v.encode()).decode("ascii") for k, v in sorted(values.items())},
    }


def build_secrets(cluster: PostgresCluster, passwords: ClusterPasswords) -> list[dict[str, Any]]:
    """All the Secrets, in the order of `secret_names`."""
    return [
        _secret(
            cluster,
            names.superuser_secret(cluster),
            {"username": SUPERUSER, "password": passwords.superuser},
        ),
        _secret(
            cluster,
            names.replication_secret(cluster),
            {"username": REPLICATION_USER, "password": passwords.replication},
        ),
        _secret(cluster, names.app_secret(cluster), app_connection(cluster, passwords.app)),
        _secret(
            cluster,
            names.patroni_api_secret(cluster),
            {"username": PATRONI_API_USER, "password": passwords.patroni_api},
        ),
    ]
