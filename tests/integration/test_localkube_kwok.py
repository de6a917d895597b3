"""The kwok profile is a real control plane: nodes, StatefulSets, garbage collection, CRD validation."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from harness.kube import wait_established
from harness.local_cluster import Kube
from harness.paths import LOCALKUBE
from harness.waiting import wait_until


def make_namespace(kube: Kube) -> str:
    ns = f"lk-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    return ns


def test_fake_node_is_ready(kube: Kube) -> None:
    nodes = json.loads(kube.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert nodes, "no nodes registered"
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", f"node {node['metadata']['name']} is not Ready"
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert version.startswith("v1.3"), f"API server reports {version}: version ldflags missing"


def test_statefulset_pods_become_ready(kube: Kube) -> None:
    ns = make_namespace(kube)
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                # KWOK's node: no process runs and no image is pulled.
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "containers": [{"name": "c", "image": "never-pulled:1"}],
                },
            },
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(sts))

    def ready_pods() -> int:
        res = kube.kubectl("get", "sts", "web", "-n", ns, "-o", "jsonpath={.status.readyReplicas}")
        return int(res.stdout or 0)

    wait_until("3 ready StatefulSet pods", lambda: ready_pods() == 3, 60)
    pods = json.loads(kube.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["web-0", "web-1", "web-2"]
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_garbage_collector_removes_dependents(kube: Kube) -> None:
    ns = make_namespace(kube)
    kube.kubectl("create", "configmap", "owner", "-n", ns)
    owner_uid = kube.kubectl("get", "cm", "owner", "-n", ns, "-o", "jsonpath={.metadata.uid}").stdout
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": ns,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(dependent))
    kube.kubectl("delete", "cm", "owner", "-n", ns)

    def dependent_gone() -> bool:
        return kube.kubectl("get", "cm", "dependent", "-n", ns, check=False).returncode != 0

    wait_until("the garbage collector to delete the dependent", dependent_gone, 60)
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_crd_schema_refuses_invalid_object(kube: Kube) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.localkube.dev"},
        "spec": {
            "group": "test.localkube.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 3}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(crd))
    wait_established(kube, "crd/widgets.test.localkube.dev")
    ns = make_namespace(kube)

    def widget(size: int) -> str:
        return json.dumps(
            {
                "apiVersion": "test.localkube.dev/v1",
                "kind": "Widget",
                "metadata": {"name": f"w{size}", "namespace": ns},
                "spec": {"size": size},
            }
        )

    wait_until(
        "the CRD to be served",
        lambda: kube.kubectl("apply", "-f", "-", input=widget(2), check=False).returncode == 0,
        timeout=30,
    )
    bad = kube.kubectl("apply", "-f", "-", input=widget(5), check=False)
    assert bad.returncode != 0
    assert "spec.size" in bad.stderr and "less than or equal to 3" in bad.stderr, bad.stderr
    kube.kubectl("delete", "namespace", ns, "--wait=false")
    kube.kubectl("delete", "crd", "widgets.test.localkube.dev")


def test_second_up_is_a_no_op_and_other_profile_says_what_to_do(kube: Kube) -> None:
    cluster = [sys.executable, str(LOCALKUBE / "cluster.py")]
    again = subprocess.run([*cluster, "up", "kwok"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
    other = subprocess.run([*cluster, "up", "full"], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0
    assert "kwok profile is running" in other.stderr and "cluster-down" in other.stderr, other.stderr
    status = subprocess.run([*cluster, "status"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "profile: kwok" in status.stdout and "cluster: ready" in status.stdout
