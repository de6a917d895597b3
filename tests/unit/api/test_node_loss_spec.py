"""spec.nodeLoss: defaults (replacement decided by the volume, after 5m), durations as the user writes
them, and bad input refused by the model and the CRD with the field named."""

from __future__ import annotations

import pytest

from harness.objects import cluster_model
from pg_operator.api.cluster import POSTGRES_CLUSTER
from pg_operator.api.crd import build
from pg_operator.api.node_loss import NodeLoss, duration_seconds


def test_defaults_leave_the_choice_to_the_volume_after_five_minutes() -> None:
    policy = cluster_model().spec.node_loss
    assert policy.replace_instances is None and policy.after_seconds == 300


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("5m", 300), ("1h", 3600), ("0s", 0)])
def test_durations(text: str, seconds: int) -> None:
    assert duration_seconds(text) == seconds
    assert NodeLoss(after=text).after_seconds == seconds


@pytest.mark.parametrize("after", ["5", "5min", "-1m", "25h", "1.5h", ""])
def test_bad_durations_are_refused_naming_the_field(after: str) -> None:
    with pytest.raises(ValueError, match=r"nodeLoss\.after"):
        cluster_model(nodeLoss={"after": after})


def test_the_crd_carries_the_bounds() -> None:
    schema = build(POSTGRES_CLUSTER)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    node_loss = schema["properties"]["spec"]["properties"]["nodeLoss"]
    after = node_loss["properties"]["after"]
    assert after["pattern"] == r"^[0-9]{1,5}(s|m|h)$"
    assert any("at most 24h" in v["message"] for v in after["x-kubernetes-validations"])
    assert node_loss["properties"]["replaceInstances"]["type"] == "boolean"
    assert node_loss["default"] == {"after": "5m"}
