"""The major-upgrade room's reads: the running major from the StatefulSet, the cluster held at it, the
upgrade's state from the annotation."""

from __future__ import annotations

import json

from harness.objects import cluster_model
from pg_operator.controller.rooms.major_upgrade import ANNOTATION, at_major, read_state, running_major
from pg_operator.specs.statefulset import statefulset


def test_running_major_is_the_statefulsets() -> None:
    assert running_major(None) is None
    assert running_major(statefulset(cluster_model(version="16"))) == "16"


def test_held_at_the_running_major_builds_that_majors_statefulset() -> None:
    wanted = cluster_model(version="17", image="registry.example/pg:17")
    held = at_major(wanted, "16")
    assert held.spec.version == "16" and held.spec.image is None and held.name == wanted.name
    assert wanted.spec.version == "17"  # the pass's copy changes, the parsed spec does not
    assert running_major(statefulset(held)) == "16"
    assert at_major(wanted, "17") is wanted


def test_state_is_read_from_the_annotation() -> None:
    state = {"from": "16", "to": "17", "phase": "Checking"}
    assert read_state({"metadata": {"annotations": {ANNOTATION: json.dumps(state)}}}) == state
    assert read_state({"metadata": {}}) is None
    assert read_state({"metadata": {"annotations": {ANNOTATION: "not json"}}}) is None
    assert read_state({"metadata": {"annotations": {ANNOTATION: "[1]"}}}) is None
