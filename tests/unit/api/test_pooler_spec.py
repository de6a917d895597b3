"""spec.pooler: defaults, and bad input refused naming the field (pydantic side; the CRD's own rules
are checked by the API server in tests/integration/test_pooler_admission.py)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.api.manifests import rendered_files


def test_defaults() -> None:
    pooler = cluster(pooler={}).spec.pooler
    assert pooler is not None
    assert (pooler.instances, pooler.mode, pooler.read_only) == (2, "transaction", False)
    assert (pooler.default_pool_size, pooler.max_client_connections) == (None, None)
    assert pooler.max_prepared_statements is None  # the pod's default: 200 (pooler/config.py)
    assert pooler.sides == ("rw",)
    assert pooler.memory_limit == "64Mi"
    assert cluster().spec.pooler is None


@pytest.mark.parametrize(
    ("pooler", "named"),
    [
        ({"instances": 0}, "instances"),
        ({"instances": 11}, "instances"),
        ({"mode": "statement"}, "mode"),
        ({"defaultPoolSize": 0}, "defaultPoolSize"),
        ({"maxClientConnections": 0}, "maxClientConnections"),
        ({"maxPreparedStatements": -1}, "maxPreparedStatements"),
        ({"maxPreparedStatements": 10001}, "maxPreparedStatements"),
        ({"maxPreparedStatements": "many"}, "maxPreparedStatements"),
        ({"defaultPoolSize": 50, "maxClientConnections": 10}, "defaultPoolSize"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "cpu"),
        ({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}, "memory"),
        ({"poolSize": 3}, "poolSize"),
    ],
)
def test_bad_input_is_refused_naming_the_field(pooler: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        cluster(pooler=pooler)


def test_the_crd_carries_the_pooler_rules() -> None:
    text = "".join(rendered_files().values())
    assert "pooler.defaultPoolSize must not exceed pooler.maxClientConnections" in text
    assert "pooler.resources.requests.memory must not exceed pooler.resources.limits.memory" in text


def test_max_prepared_statements_zero_turns_them_off_and_the_crd_bounds_it() -> None:
    pooler = cluster(pooler={"maxPreparedStatements": 0}).spec.pooler
    assert pooler is not None and pooler.max_prepared_statements == 0
    text = "".join(rendered_files().values())
    assert "maxPreparedStatements" in text
