"""ConfigMap <name>-instance: instance.yaml as the instance entrypoint reads it."""

from __future__ import annotations

import yaml

from harness.objects import cluster_model as cluster
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.specs.configmap import configmap


def test_instance_yaml_carries_the_operator_owned_settings() -> None:
    c = cluster(
        postgresql={"parameters": {"shared_buffers": "256MB"}, "allowedCIDRs": ["10.0.0.0/8"]},
        synchronous={"number": 1, "dataDurability": "required"},
        bootstrap={"initdb": {"database": "orders", "owner": "shop"}},
        patroni={"ttl": 30, "loopWait": 10, "retryTimeout": 10},
    )
    cm = configmap(c)
    assert cm["metadata"]["name"] == "orders-db-instance" and list(cm["data"]) == ["instance.yaml"]
    text = cm["data"]["instance.yaml"]
    cfg = InstanceConfig.from_yaml(text)
    assert (cfg.cluster, cfg.namespace, cfg.pg_major) == ("orders-db", "shop", "16")
    assert cfg.postgresql.parameters == {"shared_buffers": "256MB"}
    assert cfg.postgresql.allowed_cidrs == ["10.0.0.0/8"] and cfg.postgresql.port == 5432
    assert (cfg.synchronous.number, cfg.synchronous.data_durability) == (1, "required")
    assert (cfg.bootstrap.database, cfg.bootstrap.owner) == ("orders", "shop")
    assert (cfg.patroni.ttl, cfg.patroni.loop_wait, cfg.patroni.retry_timeout, cfg.patroni.port) == (
        30,
        10,
        10,
        8008,
    )
    assert (cfg.users.superuser, cfg.users.replication) == ("postgres", "replicator")
    assert (cfg.labels.cluster_label, cfg.labels.role_label) == ("db.example.com/cluster", "role")
    raw = yaml.safe_load(text)
    assert raw["postgresql"]["allowedCIDRs"] == ["10.0.0.0/8"] and raw["pgMajor"] == "16"


def test_instance_yaml_is_stable_text() -> None:
    assert configmap(cluster())["data"] == configmap(cluster())["data"]
    assert (
        InstanceConfig.from_yaml(configmap(cluster())["data"]["instance.yaml"]).to_yaml()
        == (configmap(cluster())["data"]["instance.yaml"])
    )
