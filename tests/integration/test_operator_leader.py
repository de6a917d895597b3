"""Leader election between two operator processes on the real API server: one acts, the other waits;
killing the leader hands over; a process that loses its Lease exits non-zero."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_operator_harness import (
    OPERATOR_NS,
    OperatorEnv,
    OperatorProcess,
    apply,
    get_json,
    make_namespace,
    operator_env,
    postgres_cluster,
    start_operator,
    wait_until,
)

__all__ = ["operator_env"]

LEASE = "pg-operator-leader"
DURATION = 15


@pytest.fixture
def pair(operator_env: OperatorEnv) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    a = start_operator(operator_env, "leader-a")
    a.wait_leader()
    b = start_operator(operator_env, "leader-b")
    yield a, b
    for proc in (a, b):
        proc.stop()


def applies(op: OperatorProcess) -> float:
    return op.metric('pg_operator_api_requests_total{verb="apply"}')


def test_only_the_leader_acts_and_killing_it_hands_over(
    operator_env: OperatorEnv, pair: tuple[OperatorProcess, OperatorProcess]
) -> None:
    kube = operator_env.kube
    a, b = pair
    wait_until("the standby to be ready as a candidate", lambda: b.readyz() == 200, timeout=30)
    assert not b.is_leader()
    ns = make_namespace(kube, "leader")
    apply(kube, postgres_cluster("ha-db", ns, replicas=2))
    wait_until(
        "the leader to create the StatefulSet",
        lambda: kube.kubectl("get", "statefulset", "ha-db", "-n", ns, check=False).returncode == 0,
    )
    time.sleep(3)
    assert applies(a) > 0
    standby = b.metrics()
    assert standby["pg_operator_leader"] == 0
    assert applies(b) == 0, "the standby applied something"
    assert not any(k.startswith("pg_operator_reconcile_total{") and v for k, v in standby.items()), (
        "it reconciled"
    )
    holder = get_json(kube, "lease", LEASE, "-n", OPERATOR_NS)["spec"]["holderIdentity"]
    assert holder == a.identity

    a.kill9()
    killed = time.monotonic()
    wait_until("the standby to take over", b.is_leader, timeout=2 * DURATION, interval=0.1)
    handover = time.monotonic() - killed
    print(f"\nleader hand-over after kill -9: {handover:.1f} s (lease duration {DURATION} s)")
    assert get_json(kube, "lease", LEASE, "-n", OPERATOR_NS)["spec"]["holderIdentity"] == b.identity

    # the new leader reconciles: a scale-up is carried out by it
    kube.kubectl(
        "patch", "pgc", "ha-db", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"replicas": 3}})
    )
    wait_until(
        "the new leader to scale the StatefulSet",
        lambda: get_json(kube, "statefulset", "ha-db", "-n", ns)["spec"]["replicas"] == 3,
    )
    assert applies(b) > 0
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_losing_the_lease_makes_the_process_exit_non_zero(
    operator_env: OperatorEnv, pair: tuple[OperatorProcess, OperatorProcess]
) -> None:
    kube = operator_env.kube
    a, b = pair
    b.stop()
    # Someone else takes the Lease (as an expired lease would be taken): the holder must stop acting.
    kube.kubectl(
        "patch",
        "lease",
        LEASE,
        "-n",
        OPERATOR_NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"holderIdentity": "somebody-else"}}),
    )
    assert a.proc is not None
    code = a.proc.wait(timeout=DURATION)
    assert code == 1, f"exit code {code}"
    assert "lost leadership" in a.log_text()
    kube.kubectl(
        "patch",
        "lease",
        LEASE,
        "-n",
        OPERATOR_NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"holderIdentity": ""}}),
    )
