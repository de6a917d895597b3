"""Patroni's configuration for one pod, rendered from plain values. Pure: no I/O, same input → same dict.

Inputs: the pod's environment (`inputs.PodEnvironment`), the operator's instance settings (the mapping
form of `instance.yaml`, camelCase keys as `api.instance_config.InstanceConfig` dumps them), the three
Secrets' credentials, the operating-system user PostgreSQL runs as, the command Patroni runs after
initdb, and the digest of the TLS files installed (published as a tag). The result holds passwords:
`main.py` writes it to a 0600 file and logs only `redacted()`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from pg_operator.api import postgresql as api_postgresql
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.backup import instance_hook
from pg_operator.instance.inputs import Credentials, PodEnvironment, TlsFiles
from pg_operator.orchestration import patroni_settings
from pg_operator.tls_files import LOADED_TAG

# Labels of the pod contract (docs/architecture.md, pg_operator.api.constants). Repeated here so the image
# does not need the API package's dependencies; a unit test keeps them equal.
CLUSTER_LABEL = "db.example.com/cluster"
ROLE_LABEL = "role"
ROLE_PRIMARY = "primary"
ROLE_REPLICA = "replica"

# Patroni 4 raises smaller values to these floors itself (patroni/config.py, with only a warning in its
# log); refusing them here keeps the configured timing honest.
MIN_TTL = 20
MIN_LOOP_WAIT = 1
MIN_RETRY_TIMEOUT = 3

# Settings that Patroni or this entrypoint own (the API's list): the API refuses them first; refused again
# here in case the schema was bypassed.
OPERATOR_OWNED_PARAMETERS = frozenset(api_postgresql.OPERATOR_OWNED_PARAMETERS)

# The peer map that lets the OS user PostgreSQL runs as (and only it) connect over the Unix socket as the
# superuser — Patroni's own connections, `kubectl exec … psql`.
LOCAL_IDENT_MAP = "pgop_local"
# The same OS user's map to the monitoring role only, for the entrypoint's own sessions (the archive
# reporter, /metrics) and the operator's read-back of declared databases: a map of its own, so neither
# line lends the other its role.
MONITOR_IDENT_MAP = "pgop_monitor_local"
# The database the entrypoint's monitoring sessions log in to; they read every database's statistics
# from there. (The role may enter every database over the socket: the operator's roles read-back reads
# the declared databases a tenant owns as this role rather than as the superuser.)
MONITOR_DATABASE = "postgres"

# Patroni's default limit for a replica to stay a failover candidate; /readiness reuses it, so a replica
# is ready only while streaming and at most this far behind.
DEFAULT_MAXIMUM_LAG_ON_FAILOVER = 1024 * 1024


def _section(instance: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = instance.get(name)
    if not isinstance(value, Mapping):
        raise ValueError(f"instance.yaml: {name} must be a mapping")
    return value


def _int(section: Mapping[str, Any], path: str, key: str, minimum: int) -> int:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"instance.yaml: {path}.{key} must be an integer")
    if value < minimum:
        raise ValueError(f"instance.yaml: {path}.{key}={value} is below the minimum {minimum}")
    return value


def _port(section: Mapping[str, Any], path: str) -> int:
    port = _int(section, path, "port", 1)
    if port > 65535:
        raise ValueError(f"instance.yaml: {path}.port={port} is not a TCP port")
    return port


def timing(patroni: Mapping[str, Any]) -> dict[str, int]:
    """Patroni's ttl/loop_wait/retry_timeout, checked against Patroni's floors and its rule.

    After a crash nobody releases the leader lock, so failover waits for it to expire: ttl after the last
    renewal a replica saw. Replicas watch the lock, so their loop runs right after each renewal and then
    every loop_wait; failover ≈ ttl - (0..loop_wait) + promotion. Measured with two real instances on the
    kwok API server (tests/integration/test_instance_patroni.py), ttl 20: 19.8-20.7 s with loop_wait 2,
    17.5-17.6 s with loop_wait 5. A clean stop (pod deletion, rolling update) releases the lock: 1.7-3.7 s.
    ttl cannot go below Patroni's floor of 20 s, so a crash cannot fail over in 10 s with Patroni alone.
    retry_timeout is how long API-server errors are retried before a primary demotes (failsafe mode keeps
    it up while it reaches every member); Patroni's rule: loop_wait + 2 * retry_timeout <= ttl.
    """
    ttl = _int(patroni, "patroni", "ttl", MIN_TTL)
    loop_wait = _int(patroni, "patroni", "loopWait", MIN_LOOP_WAIT)
    retry_timeout = _int(patroni, "patroni", "retryTimeout", MIN_RETRY_TIMEOUT)
    if loop_wait + 2 * retry_timeout > ttl:
        raise ValueError(
            f"instance.yaml: patroni: loopWait + 2 * retryTimeout = {loop_wait + 2 * retry_timeout} "
            f"exceeds ttl = {ttl} (Patroni's rule)"
        )
    return {"ttl": ttl, "loop_wait": loop_wait, "retry_timeout": retry_timeout}


def synchronous_settings(sync: Mapping[str, Any]) -> dict[str, Any]:
    """`synchronous` → Patroni's dynamic settings (checked here; the mapping is the operator's, so both
    sides agree on it)."""
    number = _int(sync, "synchronous", "number", 0)
    durability = sync.get("dataDurability", "required")
    if durability not in ("required", "preferred"):
        raise ValueError(
            f"instance.yaml: synchronous.dataDurability={durability!r} must be 'required' or 'preferred'"
        )
    return patroni_settings.synchronous_settings(number, str(durability))


def user_parameters(parameters: Any) -> dict[str, str | int | float]:
    """The user's postgresql.conf settings; operator-owned names and non-scalar values are refused."""
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise ValueError("instance.yaml: postgresql.parameters must be a mapping")
    result: dict[str, str | int | float] = {}
    for name, value in parameters.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"instance.yaml: postgresql.parameters has an invalid name {name!r}")
        if name.lower() in OPERATOR_OWNED_PARAMETERS:
            raise ValueError(
                f"instance.yaml: postgresql.parameters.{name} is set by the operator and cannot be overridden"
            )
        if isinstance(value, bool):
            result[name] = "on" if value else "off"
        elif isinstance(value, str | int | float):
            result[name] = value
        else:
            raise ValueError(f"instance.yaml: postgresql.parameters.{name} must be a string or a number")
    return result


def allowed_networks(cidrs: Any) -> list[str]:
    """The networks that may connect with a password (normalised, e.g. 10.244.0.0/16)."""
    if not isinstance(cidrs, list) or not cidrs:
        raise ValueError("instance.yaml: postgresql.allowedCIDRs must be a non-empty list of CIDRs")
    networks: list[str] = []
    for cidr in cidrs:
        try:
            networks.append(str(ipaddress.ip_network(str(cidr), strict=False)))
        except ValueError:
            raise ValueError(f"instance.yaml: postgresql.allowedCIDRs entry {cidr!r} is not a CIDR") from None
    return networks


def pg_hba(*, superuser: str, replication: str, networks: list[str]) -> list[str]:
    """Unix socket: the superuser through its peer map; the monitoring role through its own, to every
    database (the operator reads the declared databases, which tenants own, as this role: specs/role_reads;
    PostgreSQL still checks its CONNECT privilege there). TCP, TLS only:
    - the replication role by its client certificate only (the cluster's replication CA issued it, the
      only CA PostgreSQL accepts client certificates from, so where it connects from does not matter), for
      replication and for pg_rewind's reads of `postgres`;
    - the superuser from the pod itself only (loopback), never over the network;
    - the monitoring role never (it has no password; refused by name rather than left to fail scram);
    - every other role with scram-sha-256 from the allowed networks.
    A connection without TLS is rejected by name; nothing else matches, so everything else is refused."""
    repl, su, mon = _hba_name(replication), _hba_name(superuser), _hba_name(MONITOR_ROLE)
    lines = [f"local all {su} peer map={LOCAL_IDENT_MAP}",
             f"local all {mon} peer map={MONITOR_IDENT_MAP}"]  # fmt: skip
    # `all` does not match replication connections: both kinds are named. Patroni also asks its own
    # PostgreSQL for the timeline over a loopback replication connection (an old primary rejoining).
    lines += [f"hostssl replication {repl} all cert", f"hostssl postgres {repl} all cert",
              f"hostssl all {repl} all reject"]  # fmt: skip
    lines += [f"hostssl all {su} {loopback} scram-sha-256" for loopback in ("127.0.0.1/32", "::1/128")]
    lines += [f"hostssl all {su} all reject", f"hostssl all {mon} all reject"]
    lines += [f"hostssl all all {network} scram-sha-256" for network in networks]
    for everywhere in ("0.0.0.0/0", "::/0"):
        lines += [f"hostnossl all all {everywhere} reject", f"hostnossl replication all {everywhere} reject"]
    return lines


def pg_ident(*, os_user: str, superuser: str) -> list[str]:
    """The peer maps of pg_hba's two socket lines: the OS user PostgreSQL runs as, and no other, to the
    superuser and to the monitoring role."""
    return [f"{LOCAL_IDENT_MAP} {os_user} {_hba_name(superuser)}",
            f"{MONITOR_IDENT_MAP} {os_user} {_hba_name(MONITOR_ROLE)}"]  # fmt: skip


# Replicas and pg_rewind check the primary's certificate against the cluster's CA and the member's name
# (the pod's DNS name under the headless Service, which the certificate covers), and present the
# replication role's client certificate.
PEER_SSLMODE = "verify-full"


def _replication_tls(tls: TlsFiles) -> dict[str, str]:
    return {"sslmode": PEER_SSLMODE, "sslrootcert": tls.ca, "sslcert": tls.replication_cert,
            "sslkey": tls.replication_key}  # fmt: skip


def _hba_name(name: str) -> str:
    # pg_hba.conf quotes names with double quotes; a quote inside a name cannot be expressed safely.
    if '"' in name or any(c.isspace() for c in name):
        raise ValueError(f"role name {name!r} contains a quote or whitespace")
    return f'"{name}"'


def _listen(host: str, port: int) -> str:
    return f"{host or '*'}:{port}"


def _connect(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _restapi_auth(credentials: Mapping[str, Credentials]) -> dict[str, Any]:
    api = credentials["patroni-api"]
    return {"authentication": {"username": api.username, "password": api.password}}


def _checked_secret_names(instance: Mapping[str, Any], credentials: Mapping[str, Credentials]) -> None:
    missing = [role for role in ("superuser", "replication", "app", "patroni-api") if role not in credentials]
    if missing:
        raise ValueError(f"missing credentials for {', '.join(missing)}")
    users = instance.get("users") or {}
    for role in ("superuser", "replication"):
        expected = users.get(role) if isinstance(users, Mapping) else None
        if expected is not None and expected != credentials[role].username:
            raise ValueError(
                f"secret {role}: username {credentials[role].username!r} differs from "
                f"instance.yaml users.{role}={expected!r}"
            )
    owner = _section(instance, "bootstrap").get("owner")
    if owner is not None and owner != credentials["app"].username:
        raise ValueError(
            f"secret app: username {credentials['app'].username!r} differs from "
            f"instance.yaml bootstrap.owner={owner!r}"
        )


def render_patroni_config(
    *,
    pod: PodEnvironment,
    instance: Mapping[str, Any],
    credentials: Mapping[str, Credentials],
    os_user: str,
    post_bootstrap: str,
    tls: TlsFiles,
    tls_loaded: str = "",
) -> dict[str, Any]:
    """The complete Patroni YAML document (as a dict) for this pod. With instance.yaml's `backup` section:
    archiving (archive_mode/command/timeout, max_slot_wal_keep_size, replicas' restore_command) and, for a
    restored cluster, the custom bootstrap method (barman-cloud-restore, then recovery) instead of initdb;
    post_bootstrap runs after either."""
    for key, env_value, env_name in (
        ("cluster", pod.cluster, "PGOP_CLUSTER_NAME"),
        ("namespace", pod.namespace, "PGOP_NAMESPACE"),
        ("pgMajor", pod.pg_major, "PGOP_PG_MAJOR"),
    ):
        if key in instance and str(instance[key]) != env_value:
            raise ValueError(f"instance.yaml: {key}={instance[key]!r} differs from {env_name}={env_value!r}")
    _checked_secret_names(instance, credentials)
    superuser = credentials["superuser"]
    replication = credentials["replication"]

    postgresql = _section(instance, "postgresql")
    patroni = _section(instance, "patroni")
    pg_port = _port(postgresql, "postgresql")
    api_port = _port(patroni, "patroni")
    parameters = user_parameters(postgresql.get("parameters"))
    networks = allowed_networks(postgresql.get("allowedCIDRs"))
    lag_limit = patroni.get("maximumLagOnFailover", DEFAULT_MAXIMUM_LAG_ON_FAILOVER)

    owned_parameters: dict[str, str | int | float] = {
        "unix_socket_directories": pod.run_dir,
        "password_encryption": "scram-sha-256",
        # Checksums (initdb) already let pg_rewind work; hint bits logging is the belt to those braces.
        "wal_log_hints": "on",
        "hot_standby": "on",
        # TLS on every network connection (pg_hba rejects the others), with the operator's certificate.
        "ssl": "on",
        "ssl_cert_file": tls.cert,
        "ssl_key_file": tls.key,
        # Client certificates only from the cluster's replication CA: a CA or server certificate the user
        # brings may share an issuer with others, who could then present CN=replicator.
        "ssl_ca_file": tls.replication_ca,
        "ssl_min_protocol_version": "TLSv1.2",
    }
    config = {
        "scope": pod.cluster,
        "name": pod.pod_name,
        "log": {"level": "INFO"},
        "restapi": {
            # /readiness (leader, or replica streaming within maximum_lag_on_failover), /liveness, /metrics.
            "listen": f"{pod.listen_host or '0.0.0.0'}:{api_port}",  # noqa: S104 (the pod's network)
            "connect_address": _connect(pod.peer_host(), api_port),
            # HTTPS with the server certificate; members verify each other against the CA (Patroni's
            # client takes restapi.cafile) and the member's name. No client certificates are asked for.
            "certfile": tls.cert,
            "keyfile": tls.key,
            "cafile": tls.ca,
            # Unsafe endpoints (switchover, restart, reload, config) need basic auth; the probes and the
            # operator's reads (GET /readiness, /liveness, /metrics, /cluster) stay open.
            **_restapi_auth(credentials),
        },
        "kubernetes": {
            "namespace": pod.namespace,
            # Patroni selects members (pods) and its ConfigMaps by labels + {scope_label: scope}; the pods
            # carry exactly the cluster label, so that is the whole selector.
            "labels": {},
            "scope_label": CLUSTER_LABEL,
            "role_label": ROLE_LABEL,
            "leader_label_value": ROLE_PRIMARY,
            "follower_label_value": ROLE_REPLICA,
            "standby_leader_label_value": ROLE_PRIMARY,
            # ConfigMaps <scope>-leader/-config/-failover/-sync hold the DCS; no Endpoints/Service writes.
            "use_endpoints": False,
            "pod_ip": pod.pod_ip,
            "ports": [{"name": "postgresql", "port": pg_port}],
        },
        "bootstrap": {
            "dcs": {
                **timing(patroni),
                **patroni_settings.OPERATOR_DYNAMIC_SETTINGS,
                "maximum_lag_on_failover": lag_limit,
                # The primary keeps running through an API-server outage while it can reach every member.
                "failsafe_mode": True,
                **synchronous_settings(_section(instance, "synchronous")),
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    # The user's parameters live only here (and the operator keeps them up to date
                    # through PATCH /config): a copy in the local section below would override every
                    # later change.
                    "parameters": {**patroni_settings.BASE_PARAMETERS, **parameters},
                },
            },
            "initdb": [
                "data-checksums",
                {"encoding": "UTF8"},
                {"locale": "C.UTF-8"},
                {"auth-local": "peer"},
                {"auth-host": "scram-sha-256"},
            ],
            # Creates the application owner and database (Patroni 4 dropped bootstrap.users).
            "post_bootstrap": post_bootstrap,
        },
        "postgresql": {
            "listen": _listen(pod.listen_host, pg_port),
            "connect_address": _connect(pod.peer_host(), pg_port),
            "data_dir": pod.pgdata,
            "bin_dir": pod.pg_bin_dir,
            "pgpass": f"{pod.run_dir}/pgpass",
            "use_unix_socket": True,
            "use_unix_socket_repl": False,
            "authentication": {
                # Patroni's own connections as the superuser go over the Unix socket.
                "superuser": {"username": superuser.username, "password": superuser.password},
                # Authenticated by the client certificate (pg_hba `cert`); the password is kept for
                # Patroni, which sets it on the role at bootstrap.
                "replication": {
                    "username": replication.username,
                    "password": replication.password,
                    **_replication_tls(tls),
                },
                # pg_rewind as the replication role (Patroni grants it the file functions at bootstrap),
                # so the superuser never connects over the network.
                "rewind": {
                    "username": replication.username,
                    "password": replication.password,
                    **_replication_tls(tls),
                },
            },
            "parameters": owned_parameters,
            "pg_hba": pg_hba(
                superuser=superuser.username, replication=replication.username, networks=networks
            ),
            "pg_ident": pg_ident(os_user=os_user, superuser=superuser.username),
            "create_replica_methods": ["basebackup"],
            "basebackup": [{"checkpoint": "fast"}],
            # An old primary that pg_rewind cannot bring back is re-cloned instead of staying broken.
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
        },
        # Containers have no /dev/watchdog.
        "watchdog": {"mode": "off"},
        "tags": {
            "nofailover": False,
            "noloadbalance": False,
            "clonefrom": False,
            "nosync": False,
            # Which TLS files this instance runs with, for the operator (a CA rotation waits on it).
            **({LOADED_TAG: tls_loaded} if tls_loaded else {}),
        },
    }
    backup = instance.get("backup")
    if backup is not None and not isinstance(backup, Mapping):
        raise ValueError("instance.yaml: backup must be a mapping")
    try:
        return instance_hook.apply(config, backup, pgdata=pod.pgdata, bin_dir=pod.barman_bin_dir)
    except ValueError as e:
        raise ValueError(f"instance.yaml: {e}") from None


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with every password replaced, safe to print or log."""

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: ("<redacted>" if k == "password" else walk(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result: dict[str, Any] = walk(config)
    return result
