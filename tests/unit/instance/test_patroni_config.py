"""Rendering Patroni's configuration: plain values in, plain dict out."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from pg_operator.api import constants
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.api.postgresql import OPERATOR_OWNED_PARAMETERS as API_OWNED
from pg_operator.instance import patroni_config as pc
from pg_operator.instance.inputs import Credentials, pod_environment, tls_files
from pg_operator.orchestration.patroni_settings import desired_dynamic_settings, dynamic_config_patch

ENV = {
    "PGOP_CLUSTER_NAME": "orders-db",
    "PGOP_NAMESPACE": "shop",
    "PGOP_POD_NAME": "orders-db-1",
    "PGOP_POD_IP": "10.244.0.7",
    "PGOP_PG_MAJOR": "16",
    "PGDATA": "/var/lib/postgresql/data/pgdata",
}

INSTANCE: dict[str, Any] = {
    "cluster": "orders-db",
    "namespace": "shop",
    "pgMajor": "16",
    "users": {"superuser": "postgres", "replication": "replicator"},
    "postgresql": {
        "port": 5432,
        "parameters": {"shared_buffers": "256MB", "max_connections": "200"},
        "allowedCIDRs": ["10.244.0.0/16"],
    },
    "bootstrap": {"database": "orders", "owner": "orders_owner"},
    "synchronous": {"number": 0, "dataDurability": "required"},
    "patroni": {"ttl": 20, "loopWait": 2, "retryTimeout": 5, "port": 8008},
}

TLS = tls_files("/var/run/postgresql")
PEER_TLS = {
    "sslmode": "verify-full",
    "sslrootcert": "/var/run/postgresql/tls/ca.crt",
    "sslcert": "/var/run/postgresql/tls/replication.crt",
    "sslkey": "/var/run/postgresql/tls/replication.key",
}

CREDS = {
    "superuser": Credentials("postgres", "su-secret-pw"),
    "replication": Credentials("replicator", "repl-secret-pw"),
    "app": Credentials("orders_owner", "app-secret-pw"),
    "patroni-api": Credentials("patroni", "api-secret-pw"),
}


def render(instance: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    return pc.render_patroni_config(
        pod=pod_environment(env or ENV),
        instance=instance if instance is not None else INSTANCE,
        credentials=CREDS,
        os_user="postgres",
        post_bootstrap="/opt/pg-operator/bin/python -m pg_operator.instance post-bootstrap",
        tls=TLS,
    )


def test_the_loaded_tls_files_are_published_as_a_tag() -> None:
    assert "pgop_tls" not in render()["tags"]
    tagged = pc.render_patroni_config(
        pod=pod_environment(ENV),
        instance=INSTANCE,
        credentials=CREDS,
        os_user="postgres",
        post_bootstrap="true",
        tls=TLS,
        tls_loaded="ab12",
    )
    assert tagged["tags"]["pgop_tls"] == "ab12" and tagged["tags"]["nofailover"] is False


def with_changes(path: str, value: Any) -> dict[str, Any]:
    instance = copy.deepcopy(INSTANCE)
    *parents, last = path.split(".")
    node = instance
    for key in parents:
        node = node[key]
    node[last] = value
    return instance


def test_identity_and_kubernetes_dcs() -> None:
    config = render()
    assert config["scope"] == "orders-db"
    assert config["name"] == "orders-db-1"
    k8s = config["kubernetes"]
    assert k8s["namespace"] == "shop"
    assert k8s["use_endpoints"] is False
    assert k8s["scope_label"] == constants.CLUSTER_LABEL
    assert k8s["labels"] == {}
    assert (k8s["role_label"], k8s["leader_label_value"], k8s["follower_label_value"]) == (
        constants.ROLE_LABEL,
        constants.ROLE_PRIMARY,
        constants.ROLE_REPLICA,
    )
    assert k8s["pod_ip"] == "10.244.0.7"


def test_labels_match_the_api_constants() -> None:
    assert pc.CLUSTER_LABEL == constants.CLUSTER_LABEL
    assert pc.ROLE_LABEL == constants.ROLE_LABEL
    assert (pc.ROLE_PRIMARY, pc.ROLE_REPLICA) == (constants.ROLE_PRIMARY, constants.ROLE_REPLICA)


def test_rest_api_and_postgresql_addresses() -> None:
    config = render()
    # Peers reach a member by its pod's name under the headless Service (the certificate covers it), over
    # HTTPS for the REST API.
    assert config["restapi"] == {
        "listen": "0.0.0.0:8008",
        "connect_address": "orders-db-1.orders-db.shop.svc:8008",
        "certfile": "/var/run/postgresql/tls/tls.crt",
        "keyfile": "/var/run/postgresql/tls/tls.key",
        "cafile": "/var/run/postgresql/tls/ca.crt",
        "authentication": {"username": "patroni", "password": "api-secret-pw"},
    }
    pg = config["postgresql"]
    assert pg["listen"] == "*:5432"
    assert pg["connect_address"] == "orders-db-1.orders-db.shop.svc:5432"
    assert pg["data_dir"] == "/var/lib/postgresql/data/pgdata"
    assert pg["bin_dir"] == "/usr/lib/postgresql/current/bin"
    local = render(env={**ENV, "PGOP_LISTEN_HOST": "127.0.0.1"})
    assert (local["restapi"]["listen"], local["postgresql"]["listen"]) == ("127.0.0.1:8008", "127.0.0.1:5432")
    v6 = render(env={**ENV, "PGOP_POD_IP": "fd00::7"})
    assert v6["kubernetes"]["pod_ip"] == "fd00::7"
    here = render(env={**ENV, "PGOP_CONNECT_HOST": "localhost"})
    assert (here["restapi"]["connect_address"], here["postgresql"]["connect_address"]) == (
        "localhost:8008",
        "localhost:5432",
    )


def test_dcs_settings_failsafe_rewind_timing() -> None:
    dcs = render()["bootstrap"]["dcs"]
    assert dcs["failsafe_mode"] is True
    assert dcs["postgresql"]["use_pg_rewind"] is True
    assert (dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"]) == (20, 2, 5)
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]
    assert dcs["maximum_lag_on_failover"] == pc.DEFAULT_MAXIMUM_LAG_ON_FAILOVER
    assert dcs["synchronous_mode"] is False


def test_initdb_checksums_scram_and_replicas_by_basebackup() -> None:
    config = render()
    initdb = config["bootstrap"]["initdb"]
    assert "data-checksums" in initdb
    assert {"auth-host": "scram-sha-256"} in initdb
    assert config["postgresql"]["create_replica_methods"] == ["basebackup"]
    assert config["postgresql"]["parameters"]["password_encryption"] == "scram-sha-256"
    assert config["bootstrap"]["post_bootstrap"].endswith("-m pg_operator.instance post-bootstrap")
    assert "users" not in config["bootstrap"]  # Patroni 4 ignores it


def test_users_from_secrets() -> None:
    auth = render()["postgresql"]["authentication"]
    # The superuser's connections are Patroni's own, over the Unix socket; replication and pg_rewind present
    # the replication role's certificate and verify the primary's name.
    assert auth["superuser"] == {"username": "postgres", "password": "su-secret-pw"}
    assert auth["replication"] == {"username": "replicator", "password": "repl-secret-pw", **PEER_TLS}
    assert auth["rewind"] == auth["replication"]


def test_pg_hba_tls_only_replication_by_certificate_superuser_not_over_the_network() -> None:
    instance = with_changes("postgresql.allowedCIDRs", ["10.244.0.0/16", "fd00:10:244::/56"])
    hba = render(instance)["postgresql"]["pg_hba"]
    assert hba == [
        f'local all "postgres" peer map={pc.LOCAL_IDENT_MAP}',
        f'local all "pgop_monitor" peer map={pc.MONITOR_IDENT_MAP}',
        'hostssl replication "replicator" all cert',
        'hostssl postgres "replicator" all cert',
        'hostssl all "replicator" all reject',
        'hostssl all "postgres" 127.0.0.1/32 scram-sha-256',
        'hostssl all "postgres" ::1/128 scram-sha-256',
        'hostssl all "postgres" all reject',
        'hostssl all "pgop_monitor" all reject',
        "hostssl all all 10.244.0.0/16 scram-sha-256",
        "hostssl all all fd00:10:244::/56 scram-sha-256",
        "hostnossl all all 0.0.0.0/0 reject",
        "hostnossl replication all 0.0.0.0/0 reject",
        "hostnossl all all ::/0 reject",
        "hostnossl replication all ::/0 reject",
    ]
    assert not any(("trust" in line or "md5" in line) for line in hba)
    assert all(line.endswith("reject") for line in hba if "0.0.0.0/0" in line or "::/0" in line)
    ident = render()["postgresql"]["pg_ident"]
    assert ident == [
        f'{pc.LOCAL_IDENT_MAP} postgres "postgres"',
        f'{pc.MONITOR_IDENT_MAP} postgres "pgop_monitor"',
    ]
    # Each socket line has its own map. The monitoring role's reaches every database over the socket (the
    # operator's read-back of the tenants' databases logs in as it), and none over TCP.
    local = [line.split() for line in hba if line.startswith("local ")]
    assert [(db, role, method[-1]) for _, db, role, *method in local] == [
        ("all", '"postgres"', f"map={pc.LOCAL_IDENT_MAP}"),
        ("all", '"pgop_monitor"', f"map={pc.MONITOR_IDENT_MAP}"),
    ]
    assert pc.LOCAL_IDENT_MAP != pc.MONITOR_IDENT_MAP


def test_cidr_is_normalised_and_bad_cidr_is_named() -> None:
    instance = with_changes("postgresql.allowedCIDRs", ["10.244.1.9/16"])
    assert "hostssl all all 10.244.0.0/16 scram-sha-256" in render(instance)["postgresql"]["pg_hba"]
    with pytest.raises(ValueError, match=r"allowedCIDRs entry '10\.244\.0\.0/99'"):
        render(with_changes("postgresql.allowedCIDRs", ["10.244.0.0/99"]))
    with pytest.raises(ValueError, match="allowedCIDRs must be a non-empty list"):
        render(with_changes("postgresql.allowedCIDRs", []))


@pytest.mark.parametrize(
    ("sync", "expected"),
    [
        ({"number": 0, "dataDurability": "required"}, {"synchronous_mode": False}),
        (
            {"number": 1, "dataDurability": "required"},
            {"synchronous_mode": "quorum", "synchronous_node_count": 1, "synchronous_mode_strict": True},
        ),
        (
            {"number": 2, "dataDurability": "preferred"},
            {"synchronous_mode": "quorum", "synchronous_node_count": 2, "synchronous_mode_strict": False},
        ),
    ],
)
def test_synchronous_mapping(sync: dict[str, Any], expected: dict[str, Any]) -> None:
    dcs = render(with_changes("synchronous", sync))["bootstrap"]["dcs"]
    for key, value in expected.items():
        assert dcs[key] == value
    if not expected["synchronous_mode"]:
        assert "synchronous_node_count" not in dcs
        assert dcs["synchronous_mode_strict"] is False


def test_bad_durability_is_named() -> None:
    with pytest.raises(ValueError, match=r"synchronous\.dataDurability='maybe'"):
        render(with_changes("synchronous", {"number": 1, "dataDurability": "maybe"}))


def test_user_parameters_go_to_dcs_only() -> None:
    # A copy in the local section would override the dynamic configuration, so a later change the
    # operator PATCHes into /config would never reach the running instance.
    config = render()
    dcs = config["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert dcs["shared_buffers"] == "256MB"
    assert dcs["max_connections"] == "200"
    assert dcs["wal_level"] == "replica"
    local = config["postgresql"]["parameters"]
    assert "shared_buffers" not in local and "max_connections" not in local
    assert local["unix_socket_directories"] == "/var/run/postgresql"


def test_tls_is_on_with_the_private_copies_of_the_certificate() -> None:
    local = render()["postgresql"]["parameters"]
    assert {k: v for k, v in local.items() if k.startswith("ssl")} == {
        "ssl": "on",
        "ssl_cert_file": "/var/run/postgresql/tls/tls.crt",
        "ssl_key_file": "/var/run/postgresql/tls/tls.key",
        "ssl_ca_file": "/var/run/postgresql/tls/replication-ca.crt",
        "ssl_min_protocol_version": "TLSv1.2",
    }


def test_bootstrap_dcs_equals_what_the_operator_enforces() -> None:
    # The operator's desired dynamic settings and the bootstrap copy come from one function: a fresh
    # cluster needs no PATCH /config at all.
    config = render()
    sync = INSTANCE["synchronous"]
    desired = desired_dynamic_settings(
        INSTANCE["postgresql"]["parameters"],
        sync["number"],
        sync["dataDurability"],
        {"ttl": 20, "loop_wait": 2, "retry_timeout": 5},
    )
    configmap = {"metadata": {"annotations": {"config": json.dumps(config["bootstrap"]["dcs"])}}}
    assert dynamic_config_patch(configmap, desired) is None


@pytest.mark.parametrize("name", ["listen_addresses", "PORT", "archive_command", "wal_level", "hba_file"])
def test_operator_owned_parameters_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"postgresql\.parameters\.{name} is set by the operator"):
        render(with_changes("postgresql.parameters", {name: "x"}))


def test_owned_list_covers_the_api_list() -> None:
    assert set(API_OWNED) <= pc.OPERATOR_OWNED_PARAMETERS


def test_parameter_values_must_be_scalars() -> None:
    config = render(with_changes("postgresql.parameters", {"jit": False}))
    assert config["bootstrap"]["dcs"]["postgresql"]["parameters"]["jit"] == "off"
    with pytest.raises(ValueError, match=r"postgresql\.parameters\.work_mem must be a string or a number"):
        render(with_changes("postgresql.parameters", {"work_mem": ["4MB"]}))


@pytest.mark.parametrize(
    ("patroni", "message"),
    [
        (
            {"ttl": 15, "loopWait": 2, "retryTimeout": 5, "port": 8008},
            r"patroni\.ttl=15 is below the minimum 20",
        ),
        ({"ttl": 20, "loopWait": 2, "retryTimeout": 2, "port": 8008}, r"patroni\.retryTimeout=2 is below"),
        ({"ttl": 20, "loopWait": 0, "retryTimeout": 5, "port": 8008}, r"patroni\.loopWait=0 is below"),
        ({"ttl": 20, "loopWait": 5, "retryTimeout": 8, "port": 8008}, "loopWait \\+ 2 \\* retryTimeout = 21"),
        ({"ttl": "20", "loopWait": 5, "retryTimeout": 5, "port": 8008}, r"patroni\.ttl must be an integer"),
        ({"ttl": 20, "loopWait": 2, "retryTimeout": 5, "port": 70000}, r"patroni\.port=70000 is not a TCP"),
    ],
)
def test_timing_rules(patroni: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(with_changes("patroni", patroni))


def test_config_must_belong_to_this_pod() -> None:
    with pytest.raises(ValueError, match="cluster='other' differs from PGOP_CLUSTER_NAME='orders-db'"):
        render(with_changes("cluster", "other"))
    with pytest.raises(ValueError, match="pgMajor='15' differs from PGOP_PG_MAJOR='16'"):
        render(with_changes("pgMajor", "15"))


def test_secret_usernames_must_agree_with_the_config() -> None:
    with pytest.raises(
        ValueError, match=r"secret app: username 'orders_owner' differs from .*owner='someone'"
    ):
        render(with_changes("bootstrap.owner", "someone"))
    with pytest.raises(ValueError, match="secret replication: username 'replicator' differs"):
        render(with_changes("users.replication", "repl"))


def test_redacted_hides_every_password() -> None:
    config = render()
    text = repr(pc.redacted(config))
    for creds in CREDS.values():
        assert creds.password not in text
    assert "su-secret-pw" in repr(config)  # the real config does carry it, for Patroni
    assert pc.redacted(config)["postgresql"]["authentication"]["superuser"]["username"] == "postgres"


def test_same_input_same_output() -> None:
    assert render() == render()


def test_renders_what_the_operator_model_dumps() -> None:
    model = InstanceConfig.model_validate(INSTANCE)
    dumped = model.model_dump(by_alias=True, mode="json")
    assert render(dumped)["bootstrap"]["dcs"]["ttl"] == 20
    assert render(InstanceConfig.from_yaml(model.to_yaml()).model_dump(by_alias=True, mode="json")) == render(
        dumped
    )


def test_unsafe_rest_endpoints_require_the_api_credentials() -> None:
    without = {k: v for k, v in CREDS.items() if k != "patroni-api"}
    with pytest.raises(ValueError, match="patroni-api"):
        pc.render_patroni_config(
            pod=pod_environment(ENV),
            instance=INSTANCE,
            credentials=without,
            os_user="postgres",
            post_bootstrap="true",
            tls=TLS,
        )


def test_preloaded_libraries_render_into_the_dynamic_configuration_only() -> None:
    # The operator preloads nothing of its own, so the user's list is the whole setting; it lives in the
    # dynamic configuration (a later change then reaches running members, which wait for a restart).
    assert "shared_preload_libraries" not in render()["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert "shared_preload_libraries" not in render()["postgresql"]["parameters"]
    preload = {"shared_preload_libraries": "pg_stat_statements,pgaudit", "pgaudit.log": "ddl"}
    params = {**INSTANCE["postgresql"]["parameters"], **preload}
    config = render(with_changes("postgresql.parameters", params))
    dcs = config["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert dcs["shared_preload_libraries"] == "pg_stat_statements,pgaudit"
    assert dcs["pgaudit.log"] == "ddl"
    assert "shared_preload_libraries" not in config["postgresql"]["parameters"]
