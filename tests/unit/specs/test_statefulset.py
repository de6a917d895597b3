"""The StatefulSet: pod contract with the instance entrypoint, and immutable fields kept on update."""

from __future__ import annotations

import copy
from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.images import default_image
from pg_operator.specs.labels import selector_labels
from pg_operator.specs.statefulset import statefulset


def pod_spec(sts: dict[str, Any]) -> dict[str, Any]:
    return sts["spec"]["template"]["spec"]


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(sts)["containers"]
    return c


def test_controller_policies() -> None:
    spec = statefulset(cluster())["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "orders-db"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"] == {"matchLabels": selector_labels(cluster())}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_volume_claim_template() -> None:
    (vct,) = statefulset(cluster(storageClassName="fast"))["spec"]["volumeClaimTemplates"]
    assert vct["metadata"]["name"] == "data"
    assert vct["metadata"]["labels"][CLUSTER_LABEL] == "orders-db"
    assert vct["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast",
    }
    (vct,) = statefulset(cluster())["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in vct["spec"]  # the cluster's default StorageClass


def test_pod_labels_and_identity() -> None:
    sts = statefulset(cluster())
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels[CLUSTER_LABEL] == "orders-db"
    assert {k: labels[k] for k in selector_labels(cluster())} == selector_labels(cluster())
    assert labels["app.kubernetes.io/component"] == "instance"
    assert pod_spec(sts)["serviceAccountName"] == "orders-db-instance"
    assert pod_spec(sts)["terminationGracePeriodSeconds"] >= 30


def test_image_default_and_pin() -> None:
    assert container(statefulset(cluster()))["image"] == default_image("16")
    assert container(statefulset(cluster(version="15")))["image"] == default_image("15")
    assert (
        container(statefulset(cluster(image="registry.local/pg:16.9")))["image"] == "registry.local/pg:16.9"
    )
    assert "command" not in container(statefulset(cluster())) and "args" not in container(
        statefulset(cluster())
    )


def test_environment_of_the_pod_contract() -> None:
    env = {e["name"]: e for e in container(statefulset(cluster()))["env"]}
    assert env["PGOP_CLUSTER_NAME"]["value"] == "orders-db"
    assert env["PGOP_PG_MAJOR"]["value"] == "16"
    assert env["PGDATA"]["value"] == "/var/lib/postgresql/data/pgdata"
    assert env["PGOP_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["PGOP_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PGOP_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_mounts_of_the_pod_contract() -> None:
    sts = statefulset(cluster())
    mounts = {m["mountPath"]: m for m in container(sts)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert mounts["/var/lib/postgresql/data"]["name"] == "data"
    assert volumes[mounts["/etc/pg-operator/config"]["name"]]["configMap"]["name"] == "orders-db-instance"
    for kind in ("superuser", "replication", "app"):
        mount = mounts[f"/etc/pg-operator/secrets/{kind}"]
        assert mount["readOnly"] is True
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == f"orders-db-{kind}"
        assert {i["key"] for i in secret["items"]} == {"username", "password"}
    # Everything the entrypoint installs from Secret <name>-server-tls, and never the CA's key.
    tls = volumes[mounts["/etc/pg-operator/tls"]["name"]]["secret"]
    assert tls["secretName"] == "orders-db-server-tls"
    assert [i["key"] for i in tls["items"]] == ["tls.crt", "tls.key", "ca.crt", "replication.crt",
                                                "replication.key", "replication-ca.crt"]  # fmt: skip
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory"}


def test_ports_and_probes_against_patroni() -> None:
    c = container(statefulset(cluster()))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"postgresql": 5432, "patroni": 8008, "metrics": 9187}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "patroni", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"
    startup = c["startupProbe"]
    # initdb or a base backup may take long: the startup probe tolerates at least half an hour.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    # A container restarted in place must not wait out a long startup period before readiness is probed
    # (a restarted primary would stay out of -rw that long), nor a promoted replica a long readiness one.
    assert startup["periodSeconds"] <= 1
    assert c["readinessProbe"]["periodSeconds"] <= 2


def test_resources_requests_and_limits() -> None:
    assert container(statefulset(cluster()))["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "512Mi"},
    }
    c = cluster(resources={"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}})
    assert container(statefulset(c))["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "4Gi", "cpu": "2"},
    }


def test_non_root_security_context() -> None:
    sts = statefulset(cluster())
    pod = pod_spec(sts)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (999, 999, 999)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    ctr = container(sts)["securityContext"]
    assert ctr["allowPrivilegeEscalation"] is False and ctr["runAsNonRoot"] is True
    assert ctr["capabilities"] == {"drop": ["ALL"]}
    assert ctr["seccompProfile"] == {"type": "RuntimeDefault"}


def test_anti_affinity_modes() -> None:
    pref = pod_spec(statefulset(cluster()))["affinity"]["podAntiAffinity"]
    (term,) = pref["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": selector_labels(cluster())},
        "topologyKey": "kubernetes.io/hostname",
    }
    req = pod_spec(statefulset(cluster(affinity={"podAntiAffinity": "required", "topologyKey": "zone"})))
    (rterm,) = req["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rterm["topologyKey"] == "zone"
    assert "affinity" not in pod_spec(statefulset(cluster(affinity={"podAntiAffinity": "none"})))


def test_node_selector_tolerations_and_priority() -> None:
    plain = pod_spec(statefulset(cluster()))
    assert "nodeSelector" not in plain and "tolerations" not in plain and "priorityClassName" not in plain
    assert pod_spec(statefulset(cluster(nodeSelector={"disk": "ssd"})))["nodeSelector"] == {"disk": "ssd"}
    tolerations = [
        {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
        {"operator": "Exists"},
    ]
    spec = pod_spec(statefulset(cluster(tolerations=tolerations, priorityClassName="databases")))
    assert spec["tolerations"] == tolerations
    assert spec["priorityClassName"] == "databases"


def live(sts: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: defaulted fields added to what was applied."""
    obj = copy.deepcopy(sts)
    obj["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] = "Filesystem"
    obj["spec"]["volumeClaimTemplates"][0]["status"] = {"phase": "Pending"}
    obj["spec"]["selector"]["matchLabels"]["legacy"] = "yes"
    obj["spec"]["podManagementPolicy"] = "OrderedReady"
    return obj


def test_immutable_fields_are_taken_from_the_live_statefulset() -> None:
    existing = live(statefulset(cluster()))
    grown = statefulset(cluster(storage="50Gi", storageClassName="other", replicas=5), existing)
    for key in ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy"):
        assert grown["spec"][key] == existing["spec"][key], key
    assert grown["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    # Mutable fields follow the spec; the template keeps matching the live selector.
    assert grown["spec"]["replicas"] == 5
    assert grown["spec"]["template"]["metadata"]["labels"]["legacy"] == "yes"
    # The live object is not modified.
    assert existing == live(statefulset(cluster()))


def test_without_a_live_statefulset_the_spec_decides() -> None:
    sts = statefulset(cluster(storage="50Gi"), None)
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
