"""What the instance entrypoint reads, as plain values: the pod's environment and the mounted Secrets.

Parsing is pure (mappings in, frozen values out) so it is unit-tested without a pod; `main.py` does the
reading. Every error names the variable or file at fault and never contains a password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pg_operator.tls_files import TLS_FILES

# Pod contract (docs/architecture.md). The paths can be moved by environment for tests on one host.
DEFAULT_CONFIG_FILE = "/etc/pg-operator/config/instance.yaml"
DEFAULT_SECRETS_DIR = "/etc/pg-operator/secrets"
# Secret <name>-server-tls: the server certificate, its key and the cluster's CA (api.constants.TLS_MOUNT).
DEFAULT_TLS_DIR = "/etc/pg-operator/tls"  # its keys: tls_files.TLS_FILES
# Patroni's config file, its pgpass and PostgreSQL's Unix socket; the image creates it, owned by uid 999.
DEFAULT_RUN_DIR = "/var/run/postgresql"
# The image links the one PostgreSQL it holds here (images/postgres/recipe.sh).
DEFAULT_PG_BIN_DIR = "/usr/lib/postgresql/current/bin"
# barman-cloud's commands, in the image's venv (pg_operator.backup.barman.DEFAULT_BIN_DIR; a unit test
# keeps the two equal).
DEFAULT_BARMAN_BIN_DIR = "/opt/pg-operator/bin"

SECRET_ROLES = ("superuser", "replication", "app", "patroni-api")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAJOR = re.compile(r"^[0-9]{2}$")


@dataclass(frozen=True)
class Credentials:
    """A database role's name and password. The password never appears in repr() or str()."""

    username: str
    password: str = field(repr=False)

    def __str__(self) -> str:
        return f"Credentials(username={self.username!r})"


@dataclass(frozen=True)
class PodEnvironment:
    cluster: str  # Patroni scope
    namespace: str
    pod_name: str  # Patroni member name
    pod_ip: str
    pg_major: str
    pgdata: str
    config_file: str
    secrets_dir: str
    run_dir: str
    pg_bin_dir: str
    # Address PostgreSQL and the REST API listen on; "" = every address (the pod). Tests on a shared host
    # set PGOP_LISTEN_HOST=127.0.0.1.
    listen_host: str = ""
    barman_bin_dir: str = DEFAULT_BARMAN_BIN_DIR
    tls_dir: str = DEFAULT_TLS_DIR
    # The name peers reach this member by (PostgreSQL and the REST API): the pod's DNS name under the
    # headless Service, which the server certificate covers, so peers verify it (verify-full, HTTPS).
    # "" = that name; tests on one host set PGOP_CONNECT_HOST=localhost.
    connect_host: str = ""

    def peer_host(self) -> str:
        return self.connect_host or f"{self.pod_name}.{self.cluster}.{self.namespace}.svc"


@dataclass(frozen=True)
class TlsFiles:
    """Where PostgreSQL finds its certificate, key and CA: private copies in the run directory (the key
    must belong to the server's user with mode 0600; a Secret volume gives neither)."""

    cert: str
    key: str
    ca: str
    replication_cert: str
    replication_key: str
    replication_ca: str  # PostgreSQL's ssl_ca_file: never `ca`, which may hold a CA the user brings

    def paths(self) -> tuple[str, ...]:
        """In the order of TLS_FILES."""
        return (self.cert, self.key, self.ca, self.replication_cert, self.replication_key,
                self.replication_ca)  # fmt: skip


def tls_files(run_dir: str, version: str = "") -> TlsFiles:
    """The stable copies, or with `version` (the files' digest) the copies Patroni and PostgreSQL are
    configured with: a new version is a new path, which is what makes Patroni restart its REST API with
    the new certificate on the reload that also publishes the version (an unchanged path is reloaded
    only by a reload that changes nothing else)."""
    base = f"{run_dir}/tls/{version}" if version else f"{run_dir}/tls"
    return TlsFiles(*(f"{base}/{name}" for name in TLS_FILES))


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is required and empty or unset")
    return value


def _dns_label(env: Mapping[str, str], name: str) -> str:
    value = _required(env, name)
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(f"environment variable {name}={value!r} is not a DNS label")
    return value


def pod_environment(env: Mapping[str, str]) -> PodEnvironment:
    """The pod's identity and paths from its environment (the StatefulSet sets the PGOP_* variables)."""
    pg_major = _required(env, "PGOP_PG_MAJOR")
    if not _MAJOR.match(pg_major):
        raise ValueError(f"environment variable PGOP_PG_MAJOR={pg_major!r} is not a major version like '16'")
    pgdata = _required(env, "PGDATA")
    if not pgdata.startswith("/"):
        raise ValueError(f"environment variable PGDATA={pgdata!r} must be an absolute path")
    return PodEnvironment(
        cluster=_dns_label(env, "PGOP_CLUSTER_NAME"),
        namespace=_dns_label(env, "PGOP_NAMESPACE"),
        pod_name=_dns_label(env, "PGOP_POD_NAME"),
        pod_ip=_required(env, "PGOP_POD_IP"),
        pg_major=pg_major,
        pgdata=pgdata,
        config_file=env.get("PGOP_CONFIG_FILE") or DEFAULT_CONFIG_FILE,
        secrets_dir=env.get("PGOP_SECRETS_DIR") or DEFAULT_SECRETS_DIR,
        run_dir=env.get("PGOP_RUN_DIR") or DEFAULT_RUN_DIR,
        pg_bin_dir=env.get("PGOP_PG_BIN_DIR") or DEFAULT_PG_BIN_DIR,
        listen_host=env.get("PGOP_LISTEN_HOST", "").strip(),
        barman_bin_dir=env.get("PGOP_BARMAN_BIN_DIR") or DEFAULT_BARMAN_BIN_DIR,
        tls_dir=env.get("PGOP_TLS_DIR") or DEFAULT_TLS_DIR,
        connect_host=env.get("PGOP_CONNECT_HOST", "").strip(),
    )


def credentials_from_files(role: str, files: Mapping[str, str]) -> Credentials:
    """Credentials from a mounted Secret's files (key → content); `role` names it in errors."""
    username = files.get("username", "").strip()
    password = files.get("password", "")
    # A trailing newline is an editing accident, not part of the password.
    password = password[:-1] if password.endswith("\n") else password
    if not username:
        raise ValueError(f"secret {role}: key 'username' is missing or empty")
    if not password:
        raise ValueError(f"secret {role}: key 'password' is missing or empty")
    if "\n" in password or "\x00" in password:
        raise ValueError(f"secret {role}: key 'password' contains a newline or NUL byte")
    return Credentials(username=username, password=password)


_VERSION = re.compile(r"\(PostgreSQL\) ([0-9]+)(?:\.([0-9]+))?")


def server_major(version_output: str) -> str:
    """The major version from `postgres --version` output, e.g. "postgres (PostgreSQL) 16.15" → "16"."""
    match = _VERSION.search(version_output)
    if not match:
        raise ValueError(f"cannot read a PostgreSQL version from {version_output.strip()!r}")
    return match.group(1)
