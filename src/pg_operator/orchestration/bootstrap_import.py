"""`spec.bootstrap.import`'s state machine: from the previous `status.import`, the import Job and its pod
(plain dicts as the API server sends them), where the import is and what the reconciler does next.

The phases move only forward through one table (`TRANSITIONS`), except the one way back a person takes:
a Failed import whose Job was deleted starts again (Pending, the next attempt). Succeeded is final: the
Job is deleted then and never created again, so the restore never runs twice over the cluster's data.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# The Job's containers (specs/import_job.py builds them with these names).
DUMP_CONTAINER, RESTORE_CONTAINER = "dump", "restore"
# What the dump container's termination message starts with: the entries of the dump's table of contents.
OBJECTS_PREFIX = "objects="
MAX_MESSAGE = 600  # of a failure's message in the status and the Event
IMPORT_FAILED = "ImportFailed"  # the Degraded and Ready reason of a failed import
IMPORT_RUNNING = "Importing"  # the Ready reason while it runs
CREDENTIALS_UNLABELLED = "ImportCredentialUnlabelled"  # the Degraded reason of an unlabelled password Secret


class ImportPhase(enum.Enum):
    PENDING = "Pending"
    DUMPING = "Dumping"
    RESTORING = "Restoring"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TRANSITIONS: dict[ImportPhase, frozenset[ImportPhase]] = {
    ImportPhase.PENDING: frozenset(
        {ImportPhase.DUMPING, ImportPhase.RESTORING, ImportPhase.SUCCEEDED, ImportPhase.FAILED}
    ),
    ImportPhase.DUMPING: frozenset({ImportPhase.RESTORING, ImportPhase.SUCCEEDED, ImportPhase.FAILED}),
    ImportPhase.RESTORING: frozenset({ImportPhase.SUCCEEDED, ImportPhase.FAILED}),
    ImportPhase.SUCCEEDED: frozenset(),
    # Only by deleting the failed Job (a retry).
    ImportPhase.FAILED: frozenset({ImportPhase.PENDING}),
}


@dataclass(frozen=True)
class ImportState:
    phase: ImportPhase
    database: str | None = None
    databases_done: int = 0
    databases_total: int = 1
    objects: int | None = None
    job: str | None = None
    message: str | None = None
    attempt: int = 0

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase.value,
            "databasesDone": self.databases_done,
            "databasesTotal": self.databases_total,
            "attempt": self.attempt,
        }
        for key, value in (("database", self.database), ("objects", self.objects), ("job", self.job),
                           ("message", self.message)):  # fmt: skip
            if value is not None:
                out[key] = value
        return out

    @property
    def finished(self) -> bool:
        return self.phase in (ImportPhase.SUCCEEDED, ImportPhase.FAILED)


def from_status(status: Mapping[str, Any] | None, databases: list[str]) -> ImportState:
    """The state a previous status recorded (a new cluster, or an unreadable one: Pending)."""
    total = len(databases)
    if not status:
        return ImportState(ImportPhase.PENDING, database=databases[0], databases_total=total)
    try:
        phase = ImportPhase(status.get("phase"))
    except ValueError:
        phase = ImportPhase.PENDING
    objects = status.get("objects")
    return ImportState(
        phase,
        database=status.get("database") or databases[0],
        databases_done=int(status.get("databasesDone") or 0),
        databases_total=total,
        objects=objects if isinstance(objects, int) else None,
        job=status.get("job"),
        message=status.get("message"),
        attempt=int(status.get("attempt") or 0),
    )


def move(state: ImportState, to: ImportState) -> ImportState:
    """`to` when the table allows it from `state.phase` (or it is the same phase), else `state`."""
    if to.phase == state.phase or to.phase in TRANSITIONS[state.phase]:
        return to
    return state


def bounded(message: str) -> str:
    text = " ".join(message.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _statuses(pod: Mapping[str, Any] | None, key: str) -> dict[str, Mapping[str, Any]]:
    status = (pod or {}).get("status") or {}
    return {str(s.get("name")): s for s in status.get(key) or ()}


def _terminated(container: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if container is None:
        return None
    terminated = (container.get("state") or {}).get("terminated")
    return terminated if isinstance(terminated, Mapping) else None


def objects_of(message: str | None) -> int | None:
    """The object count the dump container's termination message carries."""
    for line in (message or "").splitlines():
        if line.startswith(OBJECTS_PREFIX) and line[len(OBJECTS_PREFIX) :].strip().isdigit():
            return int(line[len(OBJECTS_PREFIX) :].strip())
    return None


def _job_failed(job: Mapping[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return str(cond.get("message") or cond.get("reason") or "the Job failed")
    return None


def _job_succeeded(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    if int(status.get("succeeded") or 0) >= 1:
        return True
    return any(
        c.get("type") == "Complete" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def failure_message(job: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str:
    """Why the Job failed: the failed step and its last words (its termination message: the log tail, as
    FallbackToLogsOnError keeps it), else the Job's own condition."""
    inits, mains = _statuses(pod, "initContainerStatuses"), _statuses(pod, "containerStatuses")
    for step, container in ((DUMP_CONTAINER, inits.get(DUMP_CONTAINER)),
                            (RESTORE_CONTAINER, mains.get(RESTORE_CONTAINER))):  # fmt: skip
        term = _terminated(container)
        if term is not None and term.get("exitCode") not in (0, None):
            words = str(term.get("message") or term.get("reason") or "").strip()
            return bounded(f"{step} failed (exit {term.get('exitCode')}): {words}")
    return bounded(_job_failed(job) or "the import Job failed")


def observe(state: ImportState, job: Mapping[str, Any] | None, pod: Mapping[str, Any] | None,
            job_name: str) -> ImportState:  # fmt: skip
    """The next state from what the cluster's Job and its pod show."""
    if state.phase == ImportPhase.SUCCEEDED:
        return state
    if job is None:
        if state.phase == ImportPhase.FAILED:  # the failed Job was deleted: run another
            return move(state, replace(state, phase=ImportPhase.PENDING, message=None, objects=None))
        return state
    running = replace(state, job=job_name, attempt=max(state.attempt, 1))
    if state.phase == ImportPhase.FAILED:
        return state
    if _job_succeeded(job):
        objects = running.objects
        dump = _terminated(_statuses(pod, "initContainerStatuses").get(DUMP_CONTAINER))
        if dump is not None:
            objects = objects_of(dump.get("message")) or objects
        done = replace(running, phase=ImportPhase.SUCCEEDED, objects=objects,
                       databases_done=state.databases_total, message=None)  # fmt: skip
        return move(state, done)
    if _job_failed(job) is not None:
        return move(state, replace(running, phase=ImportPhase.FAILED, message=failure_message(job, pod)))
    dump = _terminated(_statuses(pod, "initContainerStatuses").get(DUMP_CONTAINER))
    if dump is not None and dump.get("exitCode") == 0:
        restoring = replace(running, phase=ImportPhase.RESTORING, objects=objects_of(dump.get("message")))
        return move(state, restoring)
    if dump is not None:  # failed; the Job's condition follows
        return move(state, replace(running, phase=ImportPhase.FAILED, message=failure_message(job, pod)))
    return move(state, replace(running, phase=ImportPhase.DUMPING))


def next_attempt(state: ImportState) -> ImportState:
    """The state once a new Job was created for a Pending import."""
    return replace(state, attempt=state.attempt + 1)


def password_refusal(secret: Mapping[str, Any] | None, *, cluster: str, secret_name: str, label: str,
                     field: str) -> tuple[str, str] | None:  # fmt: skip
    """Why the source password Secret may not be handed to the import Job (None: it may): it must carry
    the cluster's label `label`=`cluster`, or a tenant could have the Job send any Secret of the namespace
    to a server of its choosing."""
    labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(label) == cluster:
        return None
    return (CREDENTIALS_UNLABELLED,
            f"{field}: Secret {secret_name} is missing or does not carry the label {label}={cluster}; "
            "the import waits for it")  # fmt: skip


def wants_job(state: ImportState, job_exists: bool, primary_running: bool) -> bool:
    """Whether the reconciler creates the import Job now: the import is not finished, none runs, and the
    new cluster's primary accepts connections."""
    return state.phase == ImportPhase.PENDING and not job_exists and primary_running


def ready_reason(state: ImportState) -> tuple[str, str] | None:
    """The Ready=False reason and message while the import is not done (None once it succeeded)."""
    if state.phase == ImportPhase.SUCCEEDED:
        return None
    if state.phase == ImportPhase.FAILED:
        return IMPORT_FAILED, state.message or "the import failed"
    where = f" of database {state.database}" if state.database else ""
    return IMPORT_RUNNING, f"import{where}: {state.phase.value}"
