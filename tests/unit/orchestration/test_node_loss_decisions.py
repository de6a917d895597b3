"""orchestration/node_loss.py on plain dicts: which instances are on lost nodes, whether a volume is pinned
to its node, Patroni's leader key, and when a lost instance may be replaced (policy, delay, safety)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_operator.api.node_loss import NodeLoss
from pg_operator.orchestration.node_loss import (
    LeaderKey,
    LostInstance,
    NodeHealth,
    Readiness,
    Verdict,
    leader_key,
    lost_instances,
    pinned_to,
    plan_replacement,
    problem_message,
)

NOW = datetime(2026, 1, 2, 12, 0, 0, tzinfo=UTC)
LOST_AT = NOW - timedelta(minutes=10)


def pod(name: str, node: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T11:55:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


NODES = {
    "n1": NodeHealth("n1", Readiness.READY, None),
    "n2": NodeHealth("n2", Readiness.UNKNOWN, LOST_AT),
    "n3": NodeHealth("n3", Readiness.NOT_READY, LOST_AT),
}


def test_instances_on_not_ready_unknown_or_gone_nodes_are_lost() -> None:
    pods = [pod("db-0", "n1"), pod("db-1", "n2", deleting=True), pod("db-2", "n3"), pod("db-3", "")]
    lost = lost_instances(pods, NODES)
    assert [(i.pod, i.node, i.readiness, i.terminating) for i in lost] == [
        ("db-1", "n2", Readiness.UNKNOWN, True),
        ("db-2", "n3", Readiness.NOT_READY, False),
    ]
    message = problem_message(lost)
    assert (
        "instance db-1 is on node n2, which is Unknown (no heartbeat) since 2026-01-02T11:50:00Z" in message
    )
    assert "stuck Terminating" in message and "db-2 is on node n3, which is NotReady" in message
    gone = {"n9": NodeHealth("n9", Readiness.GONE, LOST_AT)}
    assert [i.message() for i in lost_instances([pod("db-0", "n9")], gone)] == [
        "instance db-0 is on node n9, which is gone (the Node was deleted) since 2026-01-02T11:50:00Z"
    ]
    assert lost_instances([pod("db-0", "elsewhere")], NODES) == []  # a node not judged is not lost


def volume(*terms: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
    return {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": k, "operator": op, "values": v} for k, op, v in term]} for term in terms
    ]}}}}  # fmt: skip


def test_a_volume_is_pinned_only_when_every_term_names_that_one_host() -> None:
    host = "kubernetes.io/hostname"
    assert pinned_to(volume([(host, "In", ["n2"])]), "n2") is True
    assert pinned_to(volume([(host, "In", ["n2", "n3"])]), "n2") is False
    assert pinned_to(volume([(host, "In", ["n2"])], [(host, "In", ["n3"])]), "n2") is False
    assert pinned_to(volume([("topology.kubernetes.io/zone", "In", ["zone-a"])]), "n2") is False
    assert pinned_to({"spec": {}}, "n2") is False  # network storage: follows the pod
    assert pinned_to(None, "n2") is None


def test_the_leader_key_is_read_from_patronis_annotations() -> None:
    configmap = {"metadata": {"annotations": {"leader": "db-1", "renewTime": "2026-01-02T11:59:50+00:00",
                                              "ttl": "20"}}}  # fmt: skip
    key = leader_key(configmap, 30)
    assert key == LeaderKey("db-1", NOW - timedelta(seconds=10), 20.0)
    assert key.fresh(NOW) and not key.fresh(NOW + timedelta(seconds=11))
    assert leader_key({"metadata": {"annotations": {"leader": "db-1"}}}, 30) == LeaderKey("db-1", None, 30)
    assert not LeaderKey("db-1", None, 30).fresh(NOW)
    assert leader_key({"metadata": {}}, 30) is None


LOST = LostInstance("db-2", "uid-db-2", "n3", Readiness.UNKNOWN, LOST_AT, terminating=False)
FRESH = LeaderKey("db-0", NOW - timedelta(seconds=2), 20)
READY = {"db-0": True, "db-1": True, "db-2": False}


def plan(**overrides: Any) -> Any:
    args: dict[str, Any] = {"policy": NodeLoss(), "pinned": True, "leader": FRESH, "ready": READY,
                            "replicas": 3, "lost_names": frozenset({"db-2"}), "now": NOW}  # fmt: skip
    args.update(overrides)
    return plan_replacement(overrides.pop("lost", LOST), **{k: v for k, v in args.items() if k != "lost"})


def test_the_default_replaces_node_local_volumes_only() -> None:
    assert plan().verdict is Verdict.REPLACE
    assert "pinned to the lost node" in plan().reason
    off = plan(pinned=False)
    assert off.verdict is Verdict.OFF and "can follow it" in off.reason
    assert plan(pinned=None).verdict is Verdict.OFF  # unknown: nothing is deleted on a guess


def test_the_users_setting_wins_over_the_volume() -> None:
    assert plan(policy=NodeLoss(replace_instances=False)).verdict is Verdict.OFF
    forced = plan(policy=NodeLoss(replace_instances=True), pinned=False)
    assert forced.verdict is Verdict.REPLACE and "replaceInstances is true" in forced.reason


def test_nothing_is_replaced_before_the_delay() -> None:
    waiting = plan(policy=NodeLoss(after="15m"))
    assert waiting.verdict is Verdict.WAIT
    assert waiting.wait_seconds == pytest.approx(300)
    assert plan(policy=NodeLoss(after="10m")).verdict is Verdict.REPLACE


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"leader": None}, "no instance holds a fresh leader key"),
        ({"leader": LeaderKey("db-0", NOW - timedelta(seconds=40), 20)}, "no instance holds a fresh"),
        ({"leader": LeaderKey("db-2", NOW, 20)}, "it still holds the leader key"),
        ({"ready": {**READY, "db-0": False}}, "the leader db-0 is not ready"),
        ({"ready": {**READY, "db-1": False}}, "one replacement at a time"),
        ({"ready": {"db-0": True, "db-2": False}}, "one replacement at a time"),  # db-1 being recreated
    ],
)
def test_a_replacement_waits_until_it_is_safe(overrides: dict[str, Any], why: str) -> None:
    held = plan(**overrides)
    assert held.verdict is Verdict.HOLD and why in held.reason


def test_two_lost_instances_are_replaced_one_after_the_other() -> None:
    both = frozenset({"db-1", "db-2"})
    ready = {"db-0": True, "db-1": False, "db-2": False}
    assert plan(ready=ready, lost_names=both).verdict is Verdict.REPLACE  # the others lost too, not busy
    # db-1 was replaced and is cloning (no longer lost, not ready): db-2 waits for it.
    assert plan(ready=ready, lost_names=frozenset({"db-2"})).verdict is Verdict.HOLD
