"""status.import's state machine over plain dicts of a Job and its pod."""

from __future__ import annotations

from typing import Any

from pg_operator.orchestration.bootstrap_import import (
    IMPORT_FAILED,
    MAX_MESSAGE,
    ImportPhase,
    ImportState,
    from_status,
    move,
    next_attempt,
    objects_of,
    observe,
    password_refusal,
    ready_reason,
    wants_job,
)

JOB = "orders-db-import"
DBS = ["shop"]


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": JOB}, "status": status}


def failed_job(message: str = "Job has reached the specified backoff limit") -> dict[str, Any]:
    return job(failed=1, conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                      "message": message}])  # fmt: skip


def terminated(code: int, message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "message": message, "reason": "Error" if code else "Completed"}}


def pod(dump: dict[str, Any] | None = None, restore: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if dump is not None:
        status["initContainerStatuses"] = [{"name": "dump", "state": dump}]
    if restore is not None:
        status["containerStatuses"] = [{"name": "restore", "state": restore}]
    return {"status": status}


def pending() -> ImportState:
    return from_status(None, DBS)


def test_a_new_cluster_is_pending_and_wants_a_job_once_the_primary_runs() -> None:
    state = pending()
    assert (state.phase, state.database, state.databases_total, state.attempt) == (
        ImportPhase.PENDING,
        "shop",
        1,
        0,
    )
    assert not wants_job(state, job_exists=False, primary_running=False)
    assert wants_job(state, job_exists=False, primary_running=True)
    assert not wants_job(state, job_exists=True, primary_running=True)
    assert next_attempt(state).attempt == 1


def test_dumping_then_restoring_then_succeeded() -> None:
    state = observe(pending(), job(active=1), pod(dump={"running": {}}), JOB)
    assert (state.phase, state.job) == (ImportPhase.DUMPING, JOB)
    state = observe(state, job(active=1), pod(terminated(0, "objects=42\n"), {"running": {}}), JOB)
    assert (state.phase, state.objects) == (ImportPhase.RESTORING, 42)
    state = observe(state, job(succeeded=1), pod(terminated(0, "objects=42"), terminated(0)), JOB)
    assert (state.phase, state.databases_done, state.objects, state.message) == (
        ImportPhase.SUCCEEDED,
        1,
        42,
        None,
    )
    assert ready_reason(state) is None
    assert state.as_status() == {"phase": "Succeeded", "database": "shop", "databasesDone": 1,
                                 "databasesTotal": 1, "objects": 42, "job": JOB, "attempt": 1}  # fmt: skip


def test_succeeded_is_final_even_when_the_job_is_gone() -> None:
    done = from_status({"phase": "Succeeded", "databasesDone": 1, "attempt": 1}, DBS)
    assert observe(done, None, None, JOB) == done
    assert observe(done, failed_job(), None, JOB) == done
    assert not wants_job(done, job_exists=False, primary_running=True)


def test_a_failed_dump_names_the_step_and_its_last_words() -> None:
    words = (
        'pg_dump: error: connection to server at "10.0.0.9", port 5432 failed: '
        'FATAL:  password authentication failed for user "reader"'
    )
    state = observe(pending(), failed_job(), pod(terminated(1, words)), JOB)
    assert state.phase == ImportPhase.FAILED
    assert state.message is not None and state.message.startswith("dump failed (exit 1): pg_dump: error:")
    assert "password authentication failed" in state.message
    assert ready_reason(state) == (IMPORT_FAILED, state.message)


def test_a_failed_restore_is_reported_from_its_container() -> None:
    state = observe(
        pending(), failed_job(), pod(terminated(0, "objects=3"), terminated(1, "pg_restore: error: x")), JOB
    )
    assert state.message == "restore failed (exit 1): pg_restore: error: x"


def test_without_the_pod_the_jobs_condition_says_why() -> None:
    state = observe(pending(), failed_job("Job was active longer than specified deadline"), None, JOB)
    assert state.message == "Job was active longer than specified deadline"


def test_a_dump_failure_seen_before_the_jobs_condition_is_a_failure() -> None:
    state = observe(pending(), job(active=1), pod(terminated(2, "pg_dump: error: no such database")), JOB)
    assert state.phase == ImportPhase.FAILED


def test_the_message_is_bounded_and_on_one_line() -> None:
    state = observe(pending(), failed_job(), pod(terminated(1, "line\n" * 1000)), JOB)
    assert state.message is not None and len(state.message) <= MAX_MESSAGE and "\n" not in state.message


def test_deleting_the_failed_job_retries() -> None:
    failed = from_status({"phase": "Failed", "message": "dump failed", "attempt": 1, "job": JOB}, DBS)
    assert observe(failed, failed_job(), None, JOB) == failed  # kept while the Job stays
    retry = observe(failed, None, None, JOB)
    assert (retry.phase, retry.message, retry.attempt) == (ImportPhase.PENDING, None, 1)
    assert wants_job(retry, job_exists=False, primary_running=True)
    assert next_attempt(retry).attempt == 2


def test_the_table_refuses_going_back() -> None:
    restoring = ImportState(ImportPhase.RESTORING)
    assert move(restoring, ImportState(ImportPhase.DUMPING)) == restoring
    assert move(restoring, ImportState(ImportPhase.PENDING)) == restoring
    assert move(restoring, ImportState(ImportPhase.SUCCEEDED)).phase == ImportPhase.SUCCEEDED
    # A restoring import whose pod reads as dumping (a stale list) stays restoring.
    assert observe(restoring, job(active=1), pod(dump={"running": {}}), JOB).phase == ImportPhase.RESTORING


def test_an_unreadable_status_starts_pending() -> None:
    assert from_status({"phase": "Sideways"}, DBS).phase == ImportPhase.PENDING


def test_objects_of() -> None:
    assert objects_of("objects=7") == 7
    assert objects_of("noise\nobjects= 12 \n") == 12
    assert objects_of("objects=") is None and objects_of(None) is None


def test_ready_reason_while_running() -> None:
    assert ready_reason(ImportState(ImportPhase.DUMPING, database="shop")) == (
        "Importing", "import of database shop: Dumping")  # fmt: skip


def refusal(secret: dict[str, Any] | None) -> tuple[str, str] | None:
    return password_refusal(secret, cluster="orders-db", secret_name="pw", label="db.example.com/cluster",
                            field="spec.bootstrap.import.source.passwordSecret.name")  # fmt: skip


def test_only_a_password_secret_labelled_for_the_cluster_reaches_the_job() -> None:
    """The attack: a tenant names another Secret of the namespace (another cluster's superuser Secret)
    as the source password, and points the host at a server of its own to receive it."""
    assert refusal({"metadata": {"labels": {"db.example.com/cluster": "orders-db"}}}) is None
    for secret in (None, {"metadata": {}}, {"metadata": {"labels": {"db.example.com/cluster": "other-db"}}}):
        got = refusal(secret)
        assert got is not None and got[0] == "ImportCredentialUnlabelled"
        assert got[1].startswith("spec.bootstrap.import.source.passwordSecret.name: Secret pw")
