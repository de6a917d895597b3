"""The multi-node sub-tier of the e2e tier: every module here runs on ONE full profile of three real nodes
(PGOP_FULL_NODES=3, or more when the session asks for more), shared by all of them.

- `nodes_kube` (session): the three-node cluster. The first module that asks for it restarts the full
  profile when the running one has another node count (harness/local_cluster.py), and raises
  PGOP_FULL_NODES to 3 for the rest of the session, so every later `ensure("full")` agrees.
- `nodes_operator` (session): the operator installed on it with the chart, as the e2e tier's `operator`
  (the session-scoped `operator` and the shared clusters of tests/e2e/conftest.py belong to the single-node
  cluster the rest of the tier ran on: modules here must not ask for them).
- `nodes_cluster` (session): harness/nodes_cluster.py's cluster — three instances, synchronous, a pooler,
  one instance per node and zone — serving; a module that uses it leaves it serving 3/3 (every node back,
  uncordoned, healed) for the next. A module that must break it for good brings its own.

tests/conftest.py orders this directory after the rest of the e2e tier, its single-node lifecycle tests
included, so the tier switches node count once; its own `cluster_lifecycle` tests run last. Every test
here is marked `nodes` (`-m "not nodes"` runs the e2e tier without it). Keep each module's clusters
small (SMALL resources, the fewest instances the test needs) and delete them at the module's end: the
three nodes share two cores. Test files need names unique across tests/ (the tree has no __init__.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from localkube import topology

from harness.deployed_operator import E2E_OPERATOR_ARGS, install_operator
from harness.local_cluster import ClusterManager, Kube
from harness.nodes_cluster import NAME, NAMESPACE, SPEC, NodesCluster
from harness.objects import cluster

NODES = 3


@pytest.fixture(scope="session")
def nodes_kube(cluster_manager: ClusterManager) -> Kube:
    """The full profile with at least NODES real nodes, one zone each (unless PGOP_FULL_ZONES says)."""
    if topology.requested_nodes(os.environ) < NODES:
        os.environ[topology.NODES_VARIABLE] = str(NODES)
    kube = cluster_manager.ensure("full")
    found = topology.load_layout(kube.ctx)
    assert len(found) >= NODES, f"the running full profile has {len(found)} nodes in its layout"
    return kube


@pytest.fixture(scope="session")
def nodes_operator(nodes_kube: Kube) -> Iterator[Kube]:
    """The operator installed with its Helm chart on the three-node cluster (images imported into every
    node's containerd), with the e2e tier's flags."""
    install_operator(nodes_kube, E2E_OPERATOR_ARGS)
    yield nodes_kube


@pytest.fixture(scope="session")
def nodes_cluster(nodes_operator: Kube) -> Iterator[NodesCluster]:
    """The shared three-instance cluster, serving (its primary Ready, the pooler on it)."""
    nodes_operator.kubectl("create", "namespace", NAMESPACE)
    nodes_operator.kubectl("apply", "-f", "-", input=json.dumps(cluster(NAME, NAMESPACE, **SPEC)))
    shared = NodesCluster(nodes_operator, NAMESPACE, NAME)
    shared.serving()
    yield shared
    nodes_operator.kubectl(
        "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False
    )
