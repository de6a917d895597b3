"""Why a pod cannot run (orchestration/stuck_pods.py), from pods and claims as the kubelet, the scheduler
and the volume controller leave them; the messages are theirs, word for word."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pg_operator.orchestration.stuck_pods import (
    MAX_CAUSE,
    SCHEDULING_GRACE,
    StuckReason,
    container_stuck,
    problem,
    recheck_in,
    stuck_pods,
    stuck_signature,
)

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
IMAGE = "localhost/pg-operator/postgres:16.99-missing"


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str = "db-0",
    *,
    waiting: dict[str, Any] | None = None,
    init_waiting: dict[str, Any] | None = None,
    scheduled: dict[str, Any] | None = None,
    claim: str = "pgdata-db-0",
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if scheduled is not None:
        status["conditions"].append({"type": "PodScheduled", **scheduled})
    if waiting is not None or last is not None:
        state = {"waiting": waiting} if waiting is not None else {"running": {"startedAt": stamp(NOW)}}
        status["containerStatuses"] = [
            {
                "name": "postgres",
                "image": IMAGE,
                "ready": False,
                "restartCount": restarts,
                "state": state,
                "lastState": {"terminated": last} if last else {},
            }
        ]
    if init_waiting is not None:
        status["initContainerStatuses"] = [
            {
                "name": "init-data",
                "image": "busybox",
                "ready": False,
                "restartCount": restarts,
                "state": {"waiting": init_waiting},
            }
        ]
    meta: dict[str, Any] = {"name": name, "namespace": "shop"}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "initContainers": [{"name": "init-data", "image": "busybox"}],
            "containers": [{"name": "postgres", "image": IMAGE}],
            "volumes": [{"name": "pgdata", "persistentVolumeClaim": {"claimName": claim}}],
        },
        "status": status,
    }


def claim(
    name: str = "pgdata-db-0",
    *,
    phase: str = "Pending",
    age: timedelta = timedelta(minutes=1),
    storage_class: str | None = "manual",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "creationTimestamp": stamp(NOW - age),
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def unschedulable(message: str, age: timedelta = timedelta(minutes=1)) -> dict[str, Any]:
    return {
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": stamp(NOW - age),
    }


ERR_IMAGE_PULL = (
    f'rpc error: code = Unknown desc = failed to pull and unpack image "{IMAGE}": failed to resolve '
    f'reference "{IMAGE}": failed to do request: Head "https://localhost/v2/pg-operator/postgres/manifests/'
    '16.99-missing": dial tcp [::1]:443: connect: connection refused'
)


# --- the kubelet's waiting reasons -----------------------------------------------------------------------


def test_err_image_pull_names_the_pod_the_container_the_image_and_the_kubelets_message() -> None:
    found = stuck_pods([pod(waiting={"reason": "ErrImagePull", "message": ERR_IMAGE_PULL})], [], NOW)
    assert len(found) == 1
    assert found[0].reason is StuckReason.IMAGE_PULL_FAILED
    assert (found[0].pod, found[0].container, found[0].subject) == ("db-0", "postgres", IMAGE)
    message = found[0].message
    assert message.startswith(f'pod db-0 container postgres cannot pull image "{IMAGE}": rpc error')
    assert "connection refused" in message


def test_image_pull_back_off_is_the_same_cause_as_err_image_pull() -> None:
    """The kubelet alternates the two while it backs off: one cause, one Warning Event."""
    back_off = f'Back-off pulling image "{IMAGE}": ErrImagePull: {ERR_IMAGE_PULL}'
    first = container_stuck(pod(waiting={"reason": "ErrImagePull", "message": ERR_IMAGE_PULL}))
    then = container_stuck(pod(waiting={"reason": "ImagePullBackOff", "message": back_off}))
    assert first is not None and then is not None
    assert then.reason is StuckReason.IMAGE_PULL_FAILED
    assert then.identity == first.identity
    assert then.message != first.message


def test_invalid_image_name() -> None:
    message = (
        'Failed to apply default image tag "Localhost/PG:16": couldn\'t parse image name '
        '"Localhost/PG:16": invalid reference format: repository name must be lowercase'
    )
    found = container_stuck(pod(waiting={"reason": "InvalidImageName", "message": message}))
    assert found is not None and found.reason is StuckReason.IMAGE_PULL_FAILED
    assert "repository name must be lowercase" in found.message


def test_crash_loop_says_how_the_last_run_ended() -> None:
    back_off = "back-off 40s restarting failed container=postgres pod=db-0_shop(0f1e)"
    last = {"exitCode": 1, "reason": "Error", "message": "FATAL: could not read PGDATA/PG_VERSION"}
    found = container_stuck(
        pod(waiting={"reason": "CrashLoopBackOff", "message": back_off}, last=last, restarts=3)
    )
    assert found is not None and found.reason is StuckReason.CRASH_LOOP
    assert found.message == (
        "pod db-0 container postgres keeps crashing: restarted 3 time(s); last exit code 1 (Error); "
        "FATAL: could not read PGDATA/PG_VERSION"
    )


def test_crash_loop_of_an_init_container_is_found_first() -> None:
    back_off = "back-off 20s restarting failed container=init-data pod=db-0_shop(0f1e)"
    found = container_stuck(
        pod(
            init_waiting={"reason": "CrashLoopBackOff", "message": back_off},
            waiting={"reason": "PodInitializing"},
            restarts=2,
        )
    )
    assert found is not None
    assert (found.reason, found.container) == (StuckReason.CRASH_LOOP, "init-data")
    assert "restarted 2 time(s)" in found.message and back_off in found.message


def test_a_container_that_cannot_be_created() -> None:
    found = container_stuck(
        pod(waiting={"reason": "CreateContainerConfigError", "message": 'secret "db-app" not found'})
    )
    assert found is not None and found.reason is StuckReason.CONTAINER_CREATE_FAILED
    assert found.message == 'pod db-0 container postgres cannot be started: secret "db-app" not found'


def test_a_starting_container_is_not_stuck() -> None:
    for reason in ("ContainerCreating", "PodInitializing"):
        assert stuck_pods([pod(waiting={"reason": reason})], [claim(phase="Bound")], NOW) == []


def test_a_terminating_pod_is_not_stuck() -> None:
    doomed = pod(waiting={"reason": "ErrImagePull", "message": ERR_IMAGE_PULL}, deleting=True)
    assert stuck_pods([doomed], [], NOW) == []


def test_the_kubelets_message_is_truncated() -> None:
    found = container_stuck(pod(waiting={"reason": "ErrImagePull", "message": "x" * 5000}))
    assert found is not None
    assert len(found.cause) == MAX_CAUSE and found.cause.endswith("…")


# --- the scheduler ---------------------------------------------------------------------------------------

NODE_SELECTOR = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes "
    "are available: 1 Preemption is not helpful for scheduling."
)
UNBOUND = (
    "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling."
)


def test_unschedulable_with_the_schedulers_message() -> None:
    found = stuck_pods([pod(scheduled=unschedulable(NODE_SELECTOR))], [claim()], NOW)
    assert [(f.pod, f.reason) for f in found] == [("db-0", StuckReason.UNSCHEDULABLE)]
    assert found[0].message == f"pod db-0 cannot be scheduled: {NODE_SELECTOR}"


def test_unschedulable_counts_only_after_the_grace() -> None:
    fresh = pod(scheduled=unschedulable(NODE_SELECTOR, age=timedelta(seconds=3)))
    assert stuck_pods([fresh], [], NOW) == []
    wait = recheck_in([fresh], [], NOW)
    assert wait is not None and 0 < wait <= (SCHEDULING_GRACE - timedelta(seconds=3)).total_seconds() + 1


def test_unbound_volume_names_the_claim_its_class_and_the_scheduler() -> None:
    found = stuck_pods([pod(scheduled=unschedulable(UNBOUND))], [claim()], NOW)
    assert [(f.reason, f.subject) for f in found] == [(StuckReason.VOLUME_UNBOUND, "pgdata-db-0")]
    assert found[0].message == (
        'pod db-0 waits for PersistentVolumeClaim pgdata-db-0 to be bound: StorageClass "manual", no '
        f"provisioner creates a volume for it and no PersistentVolume matches; the scheduler says: {UNBOUND}"
    )


def test_a_claim_waiting_for_its_provisioner_on_a_scheduled_pod() -> None:
    annotations = {
        "volume.kubernetes.io/storage-provisioner": "ebs.csi.example.com",
        "volume.kubernetes.io/selected-node": "node-1",
    }
    found = stuck_pods([pod(waiting={"reason": "ContainerCreating"})], [claim(annotations=annotations)], NOW)
    assert [f.reason for f in found] == [StuckReason.VOLUME_UNBOUND]
    assert (
        'waiting for provisioner "ebs.csi.example.com" to create a volume, for node node-1' in found[0].cause
    )


def test_a_claim_pending_for_a_moment_is_not_stuck() -> None:
    fresh = claim(age=timedelta(seconds=2))
    assert stuck_pods([pod(waiting={"reason": "ContainerCreating"})], [fresh], NOW) == []
    assert recheck_in([pod()], [fresh], NOW) is not None
    assert stuck_pods([pod()], [claim(phase="Bound")], NOW) == []


def test_a_pending_claim_does_not_hide_a_node_selector_nobody_matches() -> None:
    """A claim whose class binds on first use stays Pending while its pod is unscheduled: the scheduler's
    reason, not the claim, is the cause."""
    found = stuck_pods([pod(scheduled=unschedulable(NODE_SELECTOR))], [claim()], NOW)
    assert [f.reason for f in found] == [StuckReason.UNSCHEDULABLE]


# --- the problem and the wake-up signature ---------------------------------------------------------------


def test_problem_names_the_first_pods_and_counts_the_rest() -> None:
    pods = [pod(f"db-{i}", waiting={"reason": "ErrImagePull", "message": "not found"}) for i in range(5)]
    reason, message = problem(stuck_pods(pods, [], NOW)) or ("", "")
    assert reason == "ImagePullFailed"
    assert message.count("cannot pull image") == 3 and message.endswith("; and 2 more pod(s)")
    assert problem([]) is None


def test_signature_moves_with_failures_not_with_normal_start() -> None:
    creating = stuck_signature(pod(waiting={"reason": "ContainerCreating"}))
    initializing = stuck_signature(pod(waiting={"reason": "PodInitializing"}))
    failing = stuck_signature(pod(waiting={"reason": "ErrImagePull", "message": "a"}))
    backing_off = stuck_signature(pod(waiting={"reason": "ImagePullBackOff", "message": "b"}))
    assert creating == initializing
    assert failing != creating and backing_off != failing
    assert stuck_signature(pod(scheduled=unschedulable(NODE_SELECTOR))) != creating
