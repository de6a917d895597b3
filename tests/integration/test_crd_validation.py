"""The generated CRD on the real API server: bad input is refused with a message naming the field,
defaults are filled in, and what compute_status produces is accepted by the status subresource."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from harness.kube import wait_established
from pg_operator.api.cluster import POSTGRES_CLUSTER, PostgresCluster, PostgresClusterSpec
from pg_operator.api.manifests import render
from pg_operator.specs import ClusterPasswords, build_secrets, compute_status, desired_children
from pg_operator.specs.statefulset import statefulset

pytestmark = pytest.mark.integration


class Api:
    """kubectl against the test namespace."""

    def __init__(self, kube: Any, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace

    def run(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.kube.kubectl("-n", self.ns, *args, input=input, check=check)

    def create(self, name: str, **spec: Any) -> Any:
        return self.run("create", "-f", "-", input=manifest(name, self.ns, spec), check=False)

    def patch(self, name: str, spec: dict[str, Any]) -> Any:
        return self.run("patch", "pgc", name, "--type=merge", "-p", json.dumps({"spec": spec}), check=False)

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.run("get", "pgc", name, "-o", "json").stdout)
        return out


def manifest(name: str, namespace: str, spec: dict[str, Any]) -> str:
    full = {"replicas": 3, "version": "16", "storage": "20Gi"} | spec
    return yaml.safe_dump(
        {
            "apiVersion": "db.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": full,
        }
    )


def refused(result: Any, *needles: str) -> str:
    assert result.returncode != 0, f"the API server accepted it:\n{result.stdout}"
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"
    return str(result.stderr)


@pytest.fixture(scope="module")
def api(kube: Any) -> Iterator[Api]:
    kube.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=pg-operator-tests",
        "-f",
        "-",
        input=render(POSTGRES_CLUSTER),
    )
    wait_established(kube, "crd/postgresclusters.db.example.com")
    ns = f"crd-validation-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    try:
        yield Api(kube, ns)
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_defaults_are_applied_by_the_api_server(api: Api) -> None:
    assert api.create("defaults").returncode == 0
    spec = api.get("defaults")["spec"]
    expected = PostgresClusterSpec(replicas=3, version="16", storage="20Gi").model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    for empty in ("nodeSelector", "tolerations"):  # empty collections outside a defaulted object stay absent
        expected.pop(empty)
    assert spec == expected
    assert spec["resources"]["requests"] == {"cpu": "250m", "memory": "512Mi"}
    assert spec["synchronous"] == {"number": 0, "dataDurability": "required"}
    assert spec["bootstrap"] == {"initdb": {"database": "app", "owner": "app"}}


def test_replicas_9_is_refused(api: Api) -> None:
    refused(api.create("nine", replicas=9), "spec.replicas", "less than or equal to 5")


def test_version_14_is_refused(api: Api) -> None:
    refused(api.create("fourteen", version="14"), "spec.version", '"14"', '"15", "16"')


def test_node_affinity_without_values_for_in_is_refused(api: Api) -> None:
    bad = {"nodeAffinity": [{"key": "zone", "operator": "In"}]}
    refused(api.create("node-affinity", affinity=bad), "spec.affinity.nodeAffinity[0].values", "take values")
    good = {"nodeAffinity": [{"key": "zone", "operator": "In", "values": ["a"]}], "zoneSpread": "required"}
    assert api.create("node-affinity-ok", affinity=good).returncode == 0


def test_storage_in_gb_is_refused(api: Api) -> None:
    refused(api.create("gigabytes", storage="20GB"), "spec.storage", "20GB")


def test_storage_grows_but_never_shrinks(api: Api) -> None:
    assert api.create("grow").returncode == 0
    refused(api.patch("grow", {"storage": "10Gi"}), "spec.storage", "never shrink", "20Gi -> 10Gi")
    assert api.get("grow")["spec"]["storage"] == "20Gi"
    assert api.patch("grow", {"storage": "30Gi"}).returncode == 0
    assert api.get("grow")["spec"]["storage"] == "30Gi"
    refused(api.patch("grow", {"storage": "25Gi"}), "spec.storage", "never shrink")


def test_version_may_be_raised_but_never_lowered(api: Api) -> None:
    assert api.create("pinned", version="16").returncode == 0
    refused(api.patch("pinned", {"version": "15"}), "spec.version", "never lowered", "16 -> 15")
    assert api.get("pinned")["spec"]["version"] == "16"
    assert api.patch("pinned", {"version": "18"}).returncode == 0  # a major may be skipped
    refused(api.patch("pinned", {"version": "17"}), "spec.version", "never lowered", "18 -> 17")
    assert api.get("pinned")["spec"]["version"] == "18"


def test_storage_class_cannot_change_or_appear_or_vanish(api: Api) -> None:
    assert api.create("classy", storageClassName="fast").returncode == 0
    refused(api.patch("classy", {"storageClassName": "slow"}), "spec.storageClassName", "immutable")
    refused(api.patch("classy", {"storageClassName": None}), "spec.storageClassName", "immutable")
    assert api.create("classless").returncode == 0
    refused(api.patch("classless", {"storageClassName": "fast"}), "spec.storageClassName", "immutable")


def test_operator_owned_parameters_are_refused(api: Api) -> None:
    params = {"wal_level": "minimal", "archive_command": "/bin/true", "shared_buffers": "256MB"}
    err = refused(
        api.create("tuned", postgresql={"parameters": params}),
        "spec.postgresql.parameters",
        "wal_level is set by the operator",
        "archive_command is set by the operator",
    )
    assert "shared_buffers" not in err
    refused(api.create("shouting", postgresql={"parameters": {"Port": "1"}}), "spec.postgresql.parameters")
    assert api.create("tuned", postgresql={"parameters": {"shared_buffers": "256MB"}}).returncode == 0


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ssl_passphrase_command", "ssl_passphrase_command runs a shell command on the server"),
        ("myext.reload_command", "a setting whose name ends in _command runs a shell command on the server"),
        ("session_preload_libraries", "session_preload_libraries loads code into the server"),
        ("ssl_cert_file", "ssl_cert_file names a file or directory on the server"),
        ("include_dir", "include_dir names a file or directory on the server"),
        ("log_directory", "log_directory chooses where the server writes log files"),
    ],
)
def test_parameters_that_run_load_or_name_files_are_refused_naming_them(
    api: Api, name: str, why: str
) -> None:
    err = refused(
        api.create("unsafe", postgresql={"parameters": {name: "x1", "work_mem": "64MB"}}),
        "spec.postgresql.parameters",
        f"{why} and cannot be set",
    )
    assert "work_mem" not in err


def test_preloaded_libraries_are_admitted_from_the_allow_list_only(api: Api) -> None:
    listed = {"shared_preload_libraries": "pg_stat_statements, auto_explain,pg_prewarm", "work_mem": "8MB"}
    assert api.create("preload", postgresql={"parameters": listed}).returncode == 0
    for value in ("pg_stat_statements,evil", "$libdir/auto_explain", "pg_stat_statements,,auto_explain"):
        refused(
            api.create("preload-bad", postgresql={"parameters": {"shared_preload_libraries": value}}),
            "spec.postgresql.parameters",
            "shared_preload_libraries: entries must be among auto_explain, pg_prewarm, pg_stat_statements",
        )
    # pgaudit: in the images of 15 and 18, not in those of 16 and 17.
    audited = {"shared_preload_libraries": "pgaudit", "pgaudit.log": "ddl", "pgaudit.role": "auditor"}
    assert api.create("audited", version="18", postgresql={"parameters": audited}).returncode == 0
    refused(api.create("audited-16", version="16", postgresql={"parameters": audited}),
            "shared_preload_libraries: pgaudit is not in the image of PostgreSQL 16 or 17")  # fmt: skip
    # CREATE EXTENSION pgaudit fails unless the library is preloaded: refused before it gets that far.
    database = [{"name": "shop", "owner": "app", "extensions": ["vector", "pgaudit"]}]
    refused(api.create("audit-db", version="18", databases=database), "spec.databases",
            "extension pgaudit needs pgaudit in postgresql.parameters.shared_preload_libraries")  # fmt: skip
    accepted = api.create("audit-db", version="18", databases=database, postgresql={"parameters": audited})
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("pgaudit.role", "postgres", "pgaudit.role must be a role name"),
        ("pgaudit.role", "pg_monitor", "pgaudit.role must be a role name"),
        ("pgaudit.log_catalog", "maybe", "pgaudit.log_catalog must be a boolean"),
        ("pgaudit.unknown", "on", "a pgaudit.* name must be one of pgaudit's settings"),
    ],
)
def test_pgaudit_settings_are_checked_by_the_api_server(api: Api, name: str, value: str, why: str) -> None:
    params = {"shared_preload_libraries": "pgaudit", name: value}
    refused(api.create("audit-bad", version="18", postgresql={"parameters": params}), why)


def test_control_characters_in_a_value_are_refused_naming_the_parameter(api: Api) -> None:
    params = {"work_mem": "4MB\nshared_preload_libraries = 'x'", "shared_buffers": "128MB"}
    err = refused(
        api.create("newline", postgresql={"parameters": params}),
        "spec.postgresql.parameters",
        "work_mem",
        "must not contain control characters",
    )
    assert "shared_buffers" not in err
    admitted = {
        "log_line_prefix": "%m [%p] ",
        "log_min_duration_statement": "250ms",
        "log_file_mode": "0600",
        "ssl_ciphers": "HIGH:!aNULL",
        "ssl_max_protocol_version": "TLSv1.3",
    }
    assert api.create("admitted", postgresql={"parameters": admitted}).returncode == 0


@pytest.mark.parametrize(("name", "value"), [("ssl", "off"), ("ssl_min_protocol_version", "TLSv1")])
def test_tls_cannot_be_turned_off_or_weakened(api: Api, name: str, value: str) -> None:
    refused(api.create("plain", postgresql={"parameters": {name: value}}), "spec.postgresql.parameters",
            f"{name} is set by the operator")  # fmt: skip


def test_what_pods_and_the_operator_refuse_is_refused_naming_the_field(api: Api) -> None:
    refused(api.create("selector", nodeSelector={"a b": "x1"}), "spec.nodeSelector", "must be a label key")
    refused(api.create("selector", nodeSelector={"disk": "s s"}), "spec.nodeSelector", "disk", "label value")
    refused(
        api.create("topology", affinity={"topologyKey": "n" * 64}), "spec.affinity.topologyKey", "label key"
    )
    refused(
        api.create("tolerant", tolerations=[{"key": "k", "value": "a b"}]),
        "spec.tolerations[0].value",
        "must be a label value",
    )
    refused(api.create("imaged", image="postgres:16 "), "spec.image", "no spaces")
    s3 = {
        "bucket": "backups",
        "endpointURL": "http://minio:9000\t",
        "credentials": {"secretName": "s3-creds"},
    }
    refused(api.create("tabbed", backup={"s3": s3}), "spec.backup.s3.endpointURL")


def test_synchronous_standbys_must_be_fewer_than_replicas(api: Api) -> None:
    refused(
        api.create("sync", replicas=2, synchronous={"number": 2}),
        "spec.synchronous.number",
        "less than replicas",
    )
    assert api.create("sync", replicas=2, synchronous={"number": 1}).returncode == 0
    refused(api.patch("sync", {"replicas": 1}), "spec.synchronous.number")


def test_scale_subresource_is_validated(api: Api) -> None:
    assert api.create("scaled").returncode == 0
    refused(api.run("scale", "pgc/scaled", "--replicas=9", check=False), "spec.replicas")
    assert api.run("scale", "pgc/scaled", "--replicas=5", check=False).returncode == 0
    assert api.get("scaled")["spec"]["replicas"] == 5


def test_other_rules_name_their_field(api: Api) -> None:
    refused(
        api.create("mem", resources={"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
        "spec.resources.requests.memory",
        "must not exceed resources.limits.memory",
    )
    refused(api.create("owner", bootstrap={"initdb": {"owner": "postgres"}}), "spec.bootstrap.initdb.owner")
    refused(api.create("timing", patroni={"ttl": 10}), "spec.patroni.ttl", "loopWait + 2 * retryTimeout")
    refused(api.create("cidr", postgresql={"allowedCIDRs": ["everywhere"]}), "spec.postgresql.allowedCIDRs")
    refused(api.create("x" * 51), "metadata.name", "at most 50 characters")
    refused(
        api.create("tolerant", tolerations=[{"operator": "Equal", "value": "db"}]),
        "spec.tolerations[0].operator",
        "without a key must use operator Exists",
    )
    assert api.create("boot").returncode == 0
    refused(
        api.patch("boot", {"bootstrap": {"initdb": {"database": "other"}}}), "spec.bootstrap", "cannot change"
    )


def test_status_written_by_the_operator_is_accepted_and_printed(api: Api) -> None:
    assert api.create("shown").returncode == 0
    obj = api.get("shown")
    pod = {
        "metadata": {"name": "shown-0", "labels": {"db.example.com/cluster": "shown", "role": "primary"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    status = compute_status(
        PostgresCluster.from_obj(obj),
        previous=None,
        statefulset={"spec": {"replicas": 3}},
        pods=[pod],
        now=datetime.now(UTC),
    )
    api.run(
        "patch", "pgc", "shown", "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
    )
    assert api.get("shown")["status"] == status
    table = api.run("get", "pgc", "shown").stdout.splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "READY", "PRIMARY", "PHASE", "AGE"]
    assert table[1].split()[:5] == ["shown", "3", "1", "shown-0", "Creating"]
    short = api.run("get", "pgc", "-o", "name").stdout
    assert "postgrescluster.db.example.com/shown" in short


def server_side_apply(api: Api, objs: list[dict[str, Any]], *, dry_run: bool) -> Any:
    args = ["apply", "--server-side", "--field-manager=pg-operator-tests", "-f", "-"]
    return api.run(
        *args, *(["--dry-run=server"] if dry_run else []), input=yaml.safe_dump_all(objs), check=False
    )


def test_every_child_the_builders_make_is_valid_for_the_api_server(api: Api) -> None:
    spec = {
        "storageClassName": "fast",
        "synchronous": {"number": 1},
        "tolerations": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}, {"operator": "Exists"}],
        # The longest label key and value the schema admits are ones the StatefulSet may carry.
        "nodeSelector": {"disk": "ssd", f"example.com/{'n' * 63}": "v" * 63},
        "affinity": {"podAntiAffinity": "required", "zoneSpread": "required"},
        "resources": {"limits": {"cpu": 2}},
        "postgresql": {"parameters": {"shared_buffers": "128MB"}},
    }
    assert api.create("children", **spec).returncode == 0
    c = PostgresCluster.from_obj(api.get("children"))
    # nodes=(): as an operator that reads Nodes builds them (the primary's and the replicas' budgets).
    objs = [*desired_children(c, nodes=()), *build_secrets(c, ClusterPasswords.generate())]
    result = server_side_apply(api, objs, dry_run=True)
    assert result.returncode == 0, result.stderr
    kinds = sorted(o["kind"] for o in objs)
    assert result.stdout.count("serverside-applied (server dry run)") == len(objs) == 16, kinds
    assert "NetworkPolicy" in kinds


def test_statefulset_update_keeps_the_immutable_fields(api: Api) -> None:
    # No owner: the garbage collector would remove a child whose owner does not exist, and no operator
    # should act on it.
    def build(storage: str, replicas: int, existing: dict[str, Any] | None) -> dict[str, Any]:
        meta = {"name": "frozen", "namespace": api.ns, "uid": "no-such-owner", "generation": 1}
        spec = {"replicas": replicas, "version": "16", "storage": storage}
        sts = statefulset(PostgresCluster.from_obj({"metadata": meta, "spec": spec}), existing)
        del sts["metadata"]["ownerReferences"]
        return sts

    assert server_side_apply(api, [build("20Gi", 3, None)], dry_run=False).returncode == 0
    live = json.loads(api.run("get", "statefulset", "frozen", "-o", "json").stdout)
    # Built without the live object, the grown storage is a forbidden StatefulSet change...
    naive = server_side_apply(api, [build("30Gi", 2, None)], dry_run=True)
    refused(naive, "spec: Forbidden: updates to statefulset spec for fields other than")
    # ...built from it, the same spec applies (the PVCs are grown directly instead).
    result = server_side_apply(api, [build("30Gi", 2, live)], dry_run=True)
    assert result.returncode == 0, result.stderr


def test_fenced_instances_must_be_this_clusters_and_hibernation_is_a_boolean(api: Api) -> None:
    assert api.create("fence", fencedInstances=["fence-2", "fence-0"], hibernation=True).returncode == 0
    assert api.create("fenceall", fencedInstances=["*"]).returncode == 0
    for bad in (["fence-3"], ["other-0"], ["fence-01"], ["*", "fence-0"], ["fence-1", "fence-1"]):
        refused(api.patch("fence", {"fencedInstances": bad}), "spec.fencedInstances")
    refused(api.create("sleepy", hibernation="yes"), "spec.hibernation")
    # Scaling below a fenced instance is refused too (through the scale subresource as well): unfence first.
    refused(api.run("scale", "pgc/fence", "--replicas=2", check=False), "spec.fencedInstances")
    assert api.run("scale", "pgc/fenceall", "--replicas=2", check=False).returncode == 0


def test_hibernation_and_fencing_status_is_accepted(api: Api) -> None:
    assert api.create("asleep", hibernation=True).returncode == 0
    status = {
        "phase": "Hibernated",
        "hibernation": {"phase": "Hibernated", "primary": "asleep-1"},
        "fencedInstances": ["asleep-0"],
        "conditions": [
            {"type": t, "status": "True", "reason": "Hibernated", "message": "", "observedGeneration": 1,
             "lastTransitionTime": "2026-12-01T12:00:00Z"} for t in ("Hibernated", "Fenced")
        ],
    }  # fmt: skip
    api.run(
        "patch", "pgc", "asleep", "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
    )
    got = api.get("asleep")["status"]
    assert got["hibernation"] == status["hibernation"] and got["fencedInstances"] == ["asleep-0"]
    assert [c["type"] for c in got["conditions"]] == ["Hibernated", "Fenced"]
