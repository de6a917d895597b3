"""The major upgrade's state machine: the annotation read and written in the format earlier operators
wrote (an upgrade in flight goes on across an operator upgrade), the one transition table, and each step's
pure decisions (which upgrade a pass works on, where the cluster is held, the image staged and how its
container went, which pods to recreate)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pg_operator.images import default_image
from pg_operator.orchestration.instances import instance_from_pod
from pg_operator.orchestration.major_upgrade_state import (
    ANNOTATION,
    CHECK_RETRY_SECONDS,
    TRANSITIONS,
    Outcome,
    Phase,
    UpgradeState,
    check_retry_in,
    current,
    held_major,
    image_not_honoured,
    next_phase,
    old_image_runs,
    outage_start,
    plan_pass,
    replicas_back,
    staging,
    staging_container,
    staging_result,
    upgrade_image,
    upgraded_system_identifier,
)

T = 1764930000.25  # a moment the examples share

# Annotations as the operator wrote them before the state was typed, one per phase it records.
EARLIER: dict[str, dict[str, Any]] = {
    "Checking": {"from": "16", "to": "17", "phase": "Checking", "started": T},
    "CheckFailed": {"from": "16", "to": "17", "phase": "CheckFailed", "started": T,
                    "message": "Checking data type usage fatal Your installation contains one of the reg* "
                               "data types in user tables.", "checked": T + 40},
    "Upgrading": {"from": "16", "to": "17", "phase": "Upgrading", "started": T, "primary": "upg-db-0",
                  "archived": T + 61.5, "paused": T + 62},
    "Starting": {"from": "16", "to": "17", "phase": "Starting", "started": T, "primary": "upg-db-0",
                 "archived": T + 61.5, "paused": T + 62, "stopRequested": T + 63, "writesStopped": T + 64.5,
                 "checkpoint": "0/5000028", "replicas": {"upg-db-1": "linked",
                                                         "upg-db-2": "re-cloned: its stop could not be run"},
                 "seedSeconds": 1.234, "seedBytes": 2245120},
    "ReplicasCatchingUp": {"from": "16", "to": "17", "phase": "ReplicasCatchingUp", "started": T,
                           "primary": "upg-db-1", "stopRequested": T + 63, "writesStopped": T + 64.5,
                           "checkpoint": "0/5000028", "replicas": {"upg-db-1": "linked"}, "resumed": T + 70,
                           "baseBackup": "upg-db-pg17-base", "writable": T + 71.25},
    "Done": {"from": "16", "to": "17", "phase": "Done", "started": T, "primary": "upg-db-0",
             "stopRequested": T + 63, "writesStopped": T + 64.5, "checkpoint": "0/5000028",
             "replicas": {"upg-db-1": "linked"}, "resumed": T + 70, "writable": T + 71.25,
             "replicasBack": T + 90, "finished": T + 120, "outage": 8.25, "generationsStored": "17"},
    "RolledBack": {"from": "16", "to": "17", "phase": "RolledBack", "started": T, "primary": "upg-db-0",
                   "paused": T + 62, "stopRequested": T + 63, "writesStopped": T + 64.5,
                   "checkpoint": "0/5000028",
                   "message": "major upgrade failed: pg_upgrade exited 1\nrolled back: PGDATA is 16's again"},
}  # fmt: skip


def body(annotation: str) -> dict[str, Any]:
    return {"metadata": {"name": "upg-db", "annotations": {ANNOTATION: annotation}}}


@pytest.mark.parametrize("phase", sorted(EARLIER))
def test_an_earlier_operators_annotation_reads_and_writes_back_unchanged(phase: str) -> None:
    written = json.dumps(EARLIER[phase], sort_keys=True)  # as the earlier operator wrote it
    state = UpgradeState.from_annotation(body(written))
    assert state is not None and state.phase == Phase(phase)
    assert (state.old_major, state.new_major, state.started) == ("16", "17", T)
    assert state.to_annotation() == written


def test_the_typed_fields_carry_the_annotations_values() -> None:
    state = UpgradeState.from_mapping(EARLIER["Starting"])
    assert state.stop_requested == T + 63 and state.writes_stopped == T + 64.5
    assert state.checkpoint == "0/5000028" and state.seed_bytes == 2245120
    assert state.replicas == {"upg-db-1": "linked", "upg-db-2": "re-cloned: its stop could not be run"}
    assert state.image is None  # an upgrade begun before spec.image was honoured: the default image
    done = UpgradeState.from_mapping(EARLIER["Done"])
    assert (done.outage, done.generations_stored, done.replicas_back) == (8.25, "17", T + 90)


def test_nulls_an_earlier_operator_wrote_read_as_unset_and_unknown_keys_are_kept() -> None:
    # The checkpoint was written as null when the primary's stop printed none.
    raw = {**EARLIER["RolledBack"], "checkpoint": None, "outage": None, "futureKey": {"a": 1}}
    state = UpgradeState.from_mapping(raw)
    assert state.checkpoint is None and state.outage is None
    assert state.to_mapping() == {k: v for k, v in raw.items() if v is not None}


def test_a_missing_or_unreadable_annotation_is_no_upgrade_and_a_wrong_one_names_its_key() -> None:
    assert UpgradeState.from_annotation({"metadata": {}}) is None
    assert UpgradeState.from_annotation(body("not json")) is None
    assert UpgradeState.from_annotation(body("[1]")) is None
    with pytest.raises(ValueError, match="'phase'"):
        UpgradeState.from_mapping({"from": "16", "to": "17", "phase": "Exploding"})
    with pytest.raises(ValueError, match="'started'"):
        UpgradeState.from_mapping({"from": "16", "to": "17", "phase": "Checking", "started": "yesterday"})
    with pytest.raises(ValueError, match="'to'"):
        UpgradeState.from_mapping({"from": "16", "phase": "Checking"})


def test_the_upgrade_moves_only_through_the_table() -> None:
    path = [Phase.CHECKING]
    while path[-1] is not Phase.DONE:
        path.append(next_phase(path[-1], Outcome.PASSED))
    assert path == [Phase.CHECKING, Phase.UPGRADING, Phase.STARTING, Phase.REPLICAS_CATCHING_UP,
                    Phase.ANALYZING, Phase.DONE]  # fmt: skip
    assert next_phase(Phase.CHECKING, Outcome.FAILED) is Phase.CHECK_FAILED
    assert next_phase(Phase.CHECK_FAILED, Outcome.RETRY) is Phase.CHECKING
    # Before writes stop (the archive is behind) nothing was stopped: a refusal like a failed check.
    assert next_phase(Phase.UPGRADING, Outcome.REFUSED) is Phase.CHECK_FAILED
    assert next_phase(Phase.UPGRADING, Outcome.FAILED) is Phase.ROLLED_BACK
    # Past the new major's start nothing rolls back, and the settled phases go nowhere on their own.
    for phase, outcome in [(Phase.STARTING, Outcome.FAILED), (Phase.ANALYZING, Outcome.FAILED),
                           (Phase.DONE, Outcome.PASSED), (Phase.ROLLED_BACK, Outcome.RETRY)]:  # fmt: skip
        with pytest.raises(ValueError, match="no transition"):
            next_phase(phase, outcome)
    # Every phase is reached by the table.
    assert {Phase.CHECKING, *TRANSITIONS.values()} == set(Phase)


def test_a_step_moves_the_state_keeping_what_it_recorded() -> None:
    state = UpgradeState.from_mapping(EARLIER["Upgrading"])
    moved = state.moved(Outcome.PASSED, checkpoint="0/5000028")
    assert moved.phase is Phase.STARTING and moved.checkpoint == "0/5000028" and moved.paused == T + 62
    assert state.phase is Phase.UPGRADING  # frozen: the step's copy changes
    assert state.with_(paused=T + 99).phase is Phase.UPGRADING


def test_the_pass_acts_on_its_own_last_saved_state_until_the_user_removes_a_settled_one() -> None:
    saved = UpgradeState.from_mapping(EARLIER["Checking"])
    mine = saved.moved(Outcome.PASSED, primary="upg-db-0")
    assert current(saved, None) is saved
    assert current(saved, mine) is mine  # the cache does not show the annotation written last pass yet
    assert current(None, mine) is mine
    assert current(None, saved.moved(Outcome.FAILED)) is None  # removed: try again


def test_a_raised_version_begins_an_upgrade_with_the_spec_image() -> None:
    assert plan_pass(None, None, "17", None, T) is None  # a new cluster
    assert plan_pass(None, "16", "16", None, T) is None
    begun = plan_pass(None, "16", "17", None, T)
    assert begun is not None and begun.begun
    assert begun.state == UpgradeState("16", "17", Phase.CHECKING, started=T)
    assert begun.state.to_mapping() == EARLIER["Checking"]  # the format earlier operators wrote
    pinned = plan_pass(None, "16", "17", "registry.example/pg:17.9", T)
    assert pinned is not None and pinned.state.image == "registry.example/pg:17.9"
    assert upgrade_image(pinned.state) == "registry.example/pg:17.9"
    assert upgrade_image(begun.state) == default_image("17")
    with pytest.raises(ValueError, match="can only be raised"):
        plan_pass(None, "17", "16", None, T)


def test_an_upgrade_in_flight_goes_on_and_a_new_target_or_image_restarts_it_before_writes_stop() -> None:
    checking = UpgradeState.from_mapping(EARLIER["Checking"])
    going = plan_pass(checking, "16", "17", None, T + 5)
    assert going is not None and not going.begun and going.state is checking
    starting = UpgradeState.from_mapping(EARLIER["Starting"])
    on = plan_pass(starting, "17", "17", None, T + 80)  # the StatefulSet already runs 17
    assert on is not None and on.state is starting
    done = UpgradeState.from_mapping(EARLIER["Done"])
    assert plan_pass(done, "17", "17", None, T + 200) is None
    again = plan_pass(done, "17", "18", None, T + 300)
    assert (
        again is not None and again.begun and (again.state.old_major, again.state.new_major) == ("17", "18")
    )
    # A corrected spec.image after a failed check (or a rollback) checks again with it at once ...
    failed = UpgradeState.from_mapping(EARLIER["CheckFailed"])
    fixed = plan_pass(failed, "16", "17", "registry.example/pg:17.9", T + 50)
    assert fixed is not None and fixed.begun and fixed.state.image == "registry.example/pg:17.9"
    assert fixed.state.phase is Phase.CHECKING
    # ... but once writes stopped the upgrade finishes with the image it checked, and says so.
    upgrading = UpgradeState.from_mapping(EARLIER["Upgrading"])
    kept = plan_pass(upgrading, "16", "17", "registry.example/pg:17.9", T + 62)
    assert kept is not None and kept.state is upgrading
    why = image_not_honoured(upgrading, "registry.example/pg:17.9")
    assert why is not None and "spec.image registry.example/pg:17.9" in why and default_image("17") in why
    assert image_not_honoured(upgrading, None) is None
    assert image_not_honoured(failed, "registry.example/pg:17.9") is None
    # spec.version back at the running major before the upgrade went anywhere: nothing to do.
    assert plan_pass(failed, "16", "16", None, T + 60) is None


def test_the_cluster_is_held_where_its_data_is() -> None:
    assert held_major(UpgradeState.from_mapping(EARLIER["Upgrading"])) == "16"
    assert held_major(UpgradeState.from_mapping(EARLIER["RolledBack"])) == "16"
    assert held_major(UpgradeState.from_mapping(EARLIER["Starting"])) == "17"
    assert held_major(UpgradeState.from_mapping(EARLIER["Done"])) == "17"


def test_the_staged_tree_is_the_operators_exact_version_or_the_images_current_one() -> None:
    own = staging(UpgradeState("16", "17", Phase.CHECKING))
    assert (own.container, own.image, own.source, own.tree) == (
        "stage-17-11", default_image("17"), "/usr/lib/postgresql/17.11", "17.11")  # fmt: skip
    theirs = staging(UpgradeState("16", "17", Phase.CHECKING, image="registry.example/pg:17.9"))
    other = staging(UpgradeState("16", "17", Phase.CHECKING, image="registry.example/pg:17.10"))
    assert theirs.image == "registry.example/pg:17.9" and theirs.source == "/usr/lib/postgresql/current/"
    assert theirs.container.startswith("stage-17-") and len(theirs.container) <= 63
    assert theirs.container != other.container and theirs.tree != other.tree  # each image staged anew
    container = staging_container(theirs)
    assert container["image"] == "registry.example/pg:17.9"
    assert "cp -a /usr/lib/postgresql/current/ " in container["command"][-1]


def _pod(statuses: list[dict[str, Any]], added: list[str]) -> dict[str, Any]:
    return {"spec": {"ephemeralContainers": [{"name": n} for n in added]},
            "status": {"ephemeralContainerStatuses": statuses}}  # fmt: skip


def test_the_staging_containers_status_says_absent_running_done_or_why_it_failed() -> None:
    stage = staging(UpgradeState("16", "17", Phase.CHECKING, image="registry.example/pg:17.9"))
    name = stage.container
    assert staging_result(_pod([], []), stage).absent
    running = staging_result(_pod([], [name]), stage)
    assert not running.absent and not running.done and running.failed is None
    creating = {"name": name, "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert staging_result(_pod([creating], [name]), stage).failed is None
    done = {"name": name, "state": {"terminated": {"exitCode": 0}}}
    assert staging_result(_pod([done], [name]), stage).done
    broken = {"name": name, "state": {"terminated": {"exitCode": 1, "message": "cp: cannot stat ..."}}}
    assert staging_result(_pod([broken], [name]), stage).failed == "exit 1: cp: cannot stat ..."
    pull = {"name": name, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
    assert staging_result(_pod([pull], [name]), stage).failed == "ImagePullBackOff: not found"
    # Another upgrade's container on the same pod is not this one.
    assert staging_result(_pod([{**done, "name": "stage-17-11"}], ["stage-17-11"]), stage).absent


def test_the_steps_read_times_outputs_and_pods() -> None:
    failed = UpgradeState.from_mapping(EARLIER["CheckFailed"])
    assert check_retry_in(failed, T + 40) == CHECK_RETRY_SECONDS
    assert check_retry_in(failed, T + 40 + CHECK_RETRY_SECONDS + 1) < 0
    # The outage counts from the stop's request; an upgrade begun by an operator that kept only the
    # stop's end counts from there.
    assert outage_start(UpgradeState.from_mapping(EARLIER["Starting"])) == T + 63
    older = {k: v for k, v in EARLIER["Starting"].items() if k != "stopRequested"}
    assert outage_start(UpgradeState.from_mapping(older)) == T + 64.5
    assert outage_start(UpgradeState.from_mapping(EARLIER["Upgrading"])) is None
    printed = "new cluster: the one the check prepared\nsystem identifier: 7446123456789012345\n"
    assert upgraded_system_identifier(0, printed) == "7446123456789012345"
    assert upgraded_system_identifier(1, printed) is None
    assert upgraded_system_identifier(0, "major upgrade failed: ...") is None

    def pod(name: str, image: str, ready: bool) -> Any:
        containers = [{"name": "postgres", "image": image}]
        conditions = [{"type": "Ready", "status": str(ready)}]
        return instance_from_pod(
            {
                "metadata": {"name": name},
                "spec": {"containers": containers},
                "status": {"conditions": conditions},
            }
        )

    new, old = default_image("17"), default_image("16")
    both = [pod("db-0", new, True), pod("db-1", old, True)]
    assert old_image_runs(both, new) and not old_image_runs(both[:1], new)
    assert not replicas_back(both[:1], 2) and not replicas_back([both[0], pod("db-1", new, False)], 2)
    assert replicas_back([both[0], pod("db-1", new, True)], 2)
