"""Fixtures the tiers share: the local cluster profile a tier needs, started for the session or reused;
the tiers' markers, order and per-test time limits; the slowest-modules report.

Tiers run in the order unit → integration (kwok profile) → e2e (full profile, one node) → the e2e tier's
multi-node sub-tier (tests/e2e/nodes: the full profile with three nodes), so one test run switches
profile at most once and node count at most once. A cluster this session started is stopped at the end
(PGOP_KEEP_CLUSTER=1 keeps it); one that was already running is reused and left as it was, unless a tier
needs the other profile. The helpers live in tests/harness (a package, on sys.path with this directory);
the tiers' own fixtures in tests/integration/conftest.py, tests/e2e/conftest.py and
tests/e2e/nodes/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.durations import ModuleDurations
from harness.local_cluster import ClusterManager, Kube
from harness.paths import REPO

TIERS = ("unit", "integration", "e2e")
# The e2e tier's multi-node sub-tier: one full profile of three real nodes shared by its modules
# (tests/e2e/nodes/conftest.py), run after the single-node e2e tests.
NODES_SUBTIER = REPO / "tests" / "e2e" / "nodes"
# Per-test limits (pytest-timeout, the call only: see pyproject's `timeout_func_only`), by tier; a
# module's own `pytest.mark.timeout` wins. Unit tests are pure and take well under a second; an
# integration test waits at most a few minutes for the API server or local processes; an e2e test's
# own waits reach 900 s for a real cluster to serve (a restore, a rolling update) plus what follows.
TIER_TIMEOUTS = {"unit": 120, "integration": 900, "e2e": 1800}


@pytest.fixture(scope="session")
def cluster_manager() -> Iterator[ClusterManager]:
    manager = ClusterManager()
    yield manager
    manager.finish()


@pytest.fixture(scope="session")
def kube(cluster_manager: ClusterManager) -> Kube:
    """The kwok profile: real control plane, fake nodes."""
    return cluster_manager.ensure("kwok")


@pytest.fixture(scope="session")
def full_kube(cluster_manager: ClusterManager) -> Kube:
    """The full profile: real control plane and a real node running real containers."""
    return cluster_manager.ensure("full")


def _tier(item: pytest.Item) -> str:
    rel = Path(str(item.fspath)).relative_to(REPO / "tests")
    return rel.parts[0] if rel.parts[0] in TIERS else "unit"


def _in_nodes_subtier(item: pytest.Item) -> bool:
    return Path(str(item.fspath)).is_relative_to(NODES_SUBTIER)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ModuleDurations(), "pg-operator-module-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Mark by directory so `-m integration` / `-m e2e` select whole tiers, and order the tiers so the
    # cluster switches profile at most once per run.
    for item in items:
        tier = _tier(item)
        if tier != "unit":
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUTS[tier]))

    # The multi-node sub-tier (tests/e2e/nodes) runs after the rest of the e2e tier, so the full profile
    # changes node count once; tests that stop the cluster (marked cluster_lifecycle) run last within
    # their tier or sub-tier.
    for item in items:
        if _in_nodes_subtier(item):
            item.add_marker(pytest.mark.nodes)

    def order(item: pytest.Item) -> tuple[int, bool, bool]:
        lifecycle = item.get_closest_marker("cluster_lifecycle") is not None
        return TIERS.index(_tier(item)), _in_nodes_subtier(item), lifecycle

    items.sort(key=order)
