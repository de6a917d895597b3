"""The sync gate: open only once every awaited kind has had a complete listing in each namespace it is
watched in; until told what to await, closed."""

from __future__ import annotations

from pg_operator.controller.cache_sync import ListedKind, SyncGate

PODS = ListedKind("v1", "Pod", "pods", label_selector="app.kubernetes.io/instance")
CLUSTERS = ListedKind("db.example.com/v1alpha1", "PostgresCluster", "postgresclusters")


def test_opens_once_every_kind_is_listed_in_every_namespace_in_any_order() -> None:
    gate = SyncGate([(PODS.key, "a"), (PODS.key, "b"), (CLUSTERS.key, "a"), (CLUSTERS.key, "b")])
    gate.listed(PODS.key, "a")
    assert not gate.open and gate.waiting_for() == {PODS.key: 1, CLUSTERS.key: 2}
    gate.listed(CLUSTERS.key, "b")
    gate.listed(CLUSTERS.key, "a")
    gate.listed(PODS.key, "elsewhere")  # not awaited: changes nothing
    assert not gate.open and gate.waiting_for() == {PODS.key: 1}
    gate.listed(PODS.key, "b")
    assert gate.open and gate.waiting_for() == {}


def test_a_gate_made_before_it_knows_its_feeds_stays_closed_until_told() -> None:
    gate = SyncGate()
    gate.listed(PODS.key)  # an early listing still counts once the feeds are named
    assert not gate.open and gate.waiting_for() == {}
    gate.expect([(PODS.key, None), (CLUSTERS.key, None)])
    assert not gate.open and gate.waiting_for() == {CLUSTERS.key: 1}
    gate.listed(CLUSTERS.key)
    assert gate.open


def test_a_gate_over_no_feeds_is_open_and_stays_open() -> None:
    gate = SyncGate([])
    assert gate.open
    gate.expect([(PODS.key, None)])  # told later: it has opened, and a relist never closes it
    gate.listed(PODS.key, "a")
    assert gate.open and gate.waiting_for() == {}
