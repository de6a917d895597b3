"""pgvector on the default major (16), whose clusters test_every_major leaves to the other modules: a
database declared with `extensions: [vector]` on the e2e tier's synchronous cluster, created by the
operator, answers a nearest-neighbour query through an IVFFlat and an HNSW index; the database is dropped
again at the end (the settings and failover modules share the cluster)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.extensions import DATABASE, connect_database, nearest_neighbours, patch_spec, wait_database
from harness.local_cluster import Kube
from harness.pgcluster import SYNC_NAME, SYNC_NAMESPACE, SYNC_SPEC, secret, status, wait_serving
from harness.waiting import wait_until
from pg_operator.images import BUILT_VERSIONS

NS, NAME = SYNC_NAMESPACE, SYNC_NAME


@pytest.fixture(scope="module")
def vectors(sync_cluster: Kube) -> Iterator[Kube]:
    wait_serving(sync_cluster, NS, NAME, int(SYNC_SPEC["replicas"]), 300)
    owner = secret(sync_cluster, NS, f"{NAME}-app")["username"]
    patch_spec(
        sync_cluster, NS, NAME, {"databases": [{"name": DATABASE, "owner": owner, "extensions": ["vector"]}]}
    )
    try:
        wait_database(sync_cluster, NS, NAME, 300)
        yield sync_cluster
    finally:
        patch_spec(sync_cluster, NS, NAME, {"removalPolicy": {"databases": "delete"}})
        patch_spec(sync_cluster, NS, NAME, {"databases": None})
        wait_until(f"{DATABASE} dropped", lambda: not status(sync_cluster, NS, NAME).get("databases"), 150, 2)
        patch_spec(sync_cluster, NS, NAME, {"removalPolicy": None})


def test_vector_answers_a_nearest_neighbour_query_on_the_default_major(vectors: Kube) -> None:
    with connect_database(vectors, NS, NAME) as conn:
        row = conn.execute("SELECT current_setting('server_version'), extversion FROM pg_extension "
                           "WHERE extname = 'vector'").fetchone()  # fmt: skip
        found, exact = nearest_neighbours(conn)
    assert row == (BUILT_VERSIONS["16"][0], "0.8.0"), row
    assert found == exact and len(found) == 3
