"""The entrypoint's fencing (instance/fencing.py): which instance.yaml fences this pod, what its port
answers the kubelet while Patroni does not run, and that a file being swapped keeps the last answer."""

from __future__ import annotations

from pathlib import Path

from harness.objects import cluster_model
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.instance.fencing import fenced_in, listed, probe_answer
from pg_operator.specs.configmap import instance_config


def test_listed_by_name_or_star() -> None:
    assert listed("db-1", ["db-1"]) and listed("db-1", ["*"])
    assert not listed("db-1", ["db-10"]) and not listed("db-1", None) and not listed("db-1", "db-1")


def test_the_operators_instance_yaml_fences_exactly_the_listed_instances(tmp_path: Path) -> None:
    file = tmp_path / "instance.yaml"
    config = instance_config(cluster_model(), frozenset({"orders-db-2", "orders-db-0"}))
    file.write_text(config.to_yaml())
    assert InstanceConfig.from_yaml(file.read_text()).fenced == ["orders-db-0", "orders-db-2"]
    assert fenced_in(str(file), "orders-db-2") is True
    assert fenced_in(str(file), "orders-db-1") is False
    unfenced = instance_config(cluster_model()).to_yaml()
    assert "fenced" not in unfenced  # an older entrypoint reads the same file as before
    file.write_text(unfenced)
    assert fenced_in(str(file), "orders-db-2") is False


def test_an_unreadable_file_keeps_the_last_answer(tmp_path: Path) -> None:
    assert fenced_in(str(tmp_path / "missing.yaml"), "db-0") is None
    (tmp_path / "broken.yaml").write_text("fenced: [db-0\n")
    assert fenced_in(str(tmp_path / "broken.yaml"), "db-0") is None


def test_a_fenced_pod_is_alive_but_never_ready() -> None:
    assert probe_answer("/liveness").status == 200
    assert probe_answer("/readiness").status == 503
    assert probe_answer("/patroni").status == 503  # a peer's Patroni finds no member here
