"""What the operator reports about nodes (kwok profile: one fake node, PGOP_KWOK_NODES): a required
anti-affinity with more instances than nodes is Degraded `TooFewNodes` naming how many nodes match, not a
silent Pending; the budgets of an operator that reads Nodes (the primary's and the replicas'); and a
one-instance cluster whose node is cordoned with spec.disruption.singleInstance: Block is Degraded
`DrainBlocked` until the node is uncordoned."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube import apply, condition, get_json, make_namespace
from harness.objects import cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.waiting import wait_until

OPERATOR = OperatorSpec("placement")


@pytest.fixture(scope="module")
def namespace(operator_env: OperatorEnv) -> Iterator[str]:
    ns = make_namespace(operator_env.kube, "placement")
    yield ns
    operator_env.kube.kubectl("delete", "namespace", ns, "--wait=false")


def degraded(kube: Any, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    cond = condition(get_json(kube, "pgc", name, "-n", ns), "Degraded")
    return cond if cond.get("status") == "True" and cond.get("reason") == reason else None


def test_more_instances_than_nodes_under_a_required_anti_affinity_is_reported_with_the_count(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    kube = operator_env.kube
    nodes = len(get_json(kube, "nodes")["items"])
    want = nodes + 1
    apply(kube, cluster("spread", namespace, replicas=want, affinity={"podAntiAffinity": "required"}))
    cond = wait_until("Degraded TooFewNodes", lambda: degraded(kube, namespace, "spread", "TooFewNodes"), 90)
    assert f"spec.replicas is {want} but only {nodes} node(s) admit the instances" in cond["message"]
    events = get_json(kube, "events", "-n", namespace, "--field-selector", "reason=TooFewNodes")["items"]
    assert any(e["type"] == "Warning" for e in events)
    # An operator that reads Nodes keeps the primary's budget beside the replicas'.
    budgets = {b["metadata"]["name"]: b["spec"] for b in get_json(kube, "pdb", "-n", namespace)["items"]}
    assert budgets["spread-primary"]["minAvailable"] == 1
    assert budgets["spread"]["minAvailable"] == want - 2
    assert budgets["spread"]["selector"]["matchLabels"]["role"] == "replica"
    # Preferred lets the instances share the node: nothing left to report.
    kube.kubectl("patch", "pgc", "spread", "-n", namespace, "--type=merge",
                 "-p", '{"spec":{"affinity":{"podAntiAffinity":"preferred"}}}')  # fmt: skip
    wait_until("TooFewNodes cleared", lambda: not degraded(kube, namespace, "spread", "TooFewNodes"), 90)


def test_a_blocked_one_instance_cluster_on_a_cordoned_node_says_what_lets_the_drain_go_on(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    kube = operator_env.kube
    apply(kube, cluster("solo", namespace, replicas=1, disruption={"singleInstance": "Block"}))

    def running_on() -> str | None:
        pods = get_json(kube, "pods", "-n", namespace, "-l", "db.example.com/cluster=solo")["items"]
        return next((p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")), None)

    node = str(wait_until("the instance scheduled", running_on, 90))
    # No Patroni on kwok: label the pod as Patroni labels a primary.
    kube.kubectl("label", "pod", "solo-0", "-n", namespace, "role=primary", "--overwrite")
    budget = get_json(kube, "pdb", "solo-primary", "-n", namespace)["spec"]
    assert budget["minAvailable"] == 1 and budget["selector"]["matchLabels"]["role"] == "primary"
    kube.kubectl("cordon", node)
    try:
        cond = wait_until(
            "Degraded DrainBlocked", lambda: degraded(kube, namespace, "solo", "DrainBlocked"), 90
        )
        assert f"node {node} is being drained" in cond["message"]
        assert "spec.disruption.singleInstance: Block" in cond["message"]
    finally:
        kube.kubectl("uncordon", node)
    wait_until("DrainBlocked cleared", lambda: not degraded(kube, namespace, "solo", "DrainBlocked"), 90)
