"""The major upgrade's state machine: its phases, the one table of transitions, and the state it keeps in
the cluster's `db.example.com/major-upgrade` annotation (docs/major-upgrades.md).

The annotation holds a JSON object; `UpgradeState.from_annotation` reads it and `to_annotation` writes the
same keys, so an upgrade in flight when the operator is replaced goes on with the new one. Keys this
version does not know are kept as they were.

A phase moves only through `next_phase(phase, outcome)`, which reads `TRANSITIONS`:

  Checking            passed → Upgrading; failed → CheckFailed
  CheckFailed         retry (after CHECK_RETRY_SECONDS) → Checking
  Upgrading           passed → Starting; refused → CheckFailed (the old major's WAL not archived: nothing
                      was stopped); failed → RolledBack (the script restored the old data, Patroni resumes)
  Starting            passed → ReplicasCatchingUp (the new major's first start: no way back from here)
  ReplicasCatchingUp  passed → Analyzing
  Analyzing           passed → Done

Besides the table, a new upgrade begins (at Checking) when the user raises `spec.version` again, removes
the annotation of a settled upgrade (CheckFailed, RolledBack, Done), or changes `spec.image` before
writes stopped (`plan_pass`).

Pure: may import `api`, `images`, `objects` and `orchestration`; never `specs` or `controller`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from pg_operator import objects
from pg_operator.api.constants import ROLE_PRIMARY
from pg_operator.images import BUILT_VERSIONS, default_image
from pg_operator.orchestration.instances import Instance
from pg_operator.orchestration.major_upgrade import WORK_DIR, requested, staged_binaries

ANNOTATION: Final = "db.example.com/major-upgrade"
# A failed check is run again after this long (the user may have fixed its cause meanwhile).
CHECK_RETRY_SECONDS: Final = 300.0


class Phase(StrEnum):
    CHECKING = "Checking"
    CHECK_FAILED = "CheckFailed"
    UPGRADING = "Upgrading"
    STARTING = "Starting"
    ROLLED_BACK = "RolledBack"
    REPLICAS_CATCHING_UP = "ReplicasCatchingUp"
    ANALYZING = "Analyzing"
    DONE = "Done"


class Outcome(StrEnum):
    """What a phase's step found, the input of a transition."""

    PASSED = "passed"  # the step's work is done
    FAILED = "failed"  # the check failed, or the upgrade failed and rolled back
    REFUSED = "refused"  # a precondition of writes stopping failed; nothing was stopped
    RETRY = "retry"  # a failed check is due to run again


TRANSITIONS: Final[Mapping[tuple[Phase, Outcome], Phase]] = {
    (Phase.CHECKING, Outcome.PASSED): Phase.UPGRADING,
    (Phase.CHECKING, Outcome.FAILED): Phase.CHECK_FAILED,
    (Phase.CHECK_FAILED, Outcome.RETRY): Phase.CHECKING,
    (Phase.UPGRADING, Outcome.REFUSED): Phase.CHECK_FAILED,
    (Phase.UPGRADING, Outcome.FAILED): Phase.ROLLED_BACK,
    (Phase.UPGRADING, Outcome.PASSED): Phase.STARTING,
    (Phase.STARTING, Outcome.PASSED): Phase.REPLICAS_CATCHING_UP,
    (Phase.REPLICAS_CATCHING_UP, Outcome.PASSED): Phase.ANALYZING,
    (Phase.ANALYZING, Outcome.PASSED): Phase.DONE,
}

# Phases whose data is on the new major (the StatefulSet runs it); before them, the old major's.
DATA_ON_NEW_MAJOR: Final = frozenset(
    {Phase.STARTING, Phase.REPLICAS_CATCHING_UP, Phase.ANALYZING, Phase.DONE}
)
# Phases a user's new `spec.image` restarts the upgrade from (writes were never stopped, or the old
# major serves again).
IMAGE_RESTARTS: Final = frozenset({Phase.CHECKING, Phase.CHECK_FAILED, Phase.ROLLED_BACK})
# Phases the user ends by removing the annotation: the next reconcile starts again from the check.
SETTLED: Final = frozenset({Phase.CHECK_FAILED, Phase.ROLLED_BACK, Phase.DONE})


def next_phase(phase: Phase, outcome: Outcome) -> Phase:
    """The phase after `outcome` in `phase`; any pair the table lacks is a bug, not a state."""
    try:
        return TRANSITIONS[(phase, outcome)]
    except KeyError:
        raise ValueError(f"no transition from {phase} on {outcome}") from None


# --- the state and its annotation ---------------------------------------------------------------------


def _key(name: str, kind: str) -> Any:
    return field(default=None, metadata={"key": name, "kind": kind})


@dataclass(frozen=True)
class UpgradeState:
    """One upgrade's progress. Times are seconds since the epoch; None: not reached (or not recorded)."""

    old_major: str = field(metadata={"key": "from", "kind": "str"})
    new_major: str = field(metadata={"key": "to", "kind": "str"})
    phase: Phase = field(metadata={"key": "phase", "kind": "phase"})
    started: float | None = _key("started", "float")
    image: str | None = _key("image", "str")  # spec.image when the upgrade began; None: the default image
    primary: str | None = _key("primary", "str")  # the instance the check ran on; later the new leader
    message: str | None = _key("message", "str")  # why the check failed or the upgrade rolled back
    checked: float | None = _key("checked", "float")  # when the check last failed
    archived: float | None = _key("archived", "float")  # the old major's WAL archived before the stop
    paused: float | None = _key("paused", "float")  # Patroni paused
    stop_requested: float | None = _key("stopRequested", "float")  # the write outage's start
    writes_stopped: float | None = _key("writesStopped", "float")  # the primary's stop returned
    checkpoint: str | None = _key("checkpoint", "str")  # the primary's shutdown checkpoint
    replicas: Mapping[str, str] | None = _key("replicas", "names")  # each replica: linked or re-cloned
    seed_seconds: float | None = _key("seedSeconds", "float")
    seed_bytes: int | None = _key("seedBytes", "int")
    resumed: float | None = _key("resumed", "float")  # Patroni resumed on the new major
    writable: float | None = _key("writable", "float")  # the new primary takes writes
    base_backup: str | None = _key("baseBackup", "str")  # the new generation's first Backup
    replicas_back: float | None = _key("replicasBack", "float")
    finished: float | None = _key("finished", "float")
    outage: float | None = _key("outage", "float")  # seconds without writes
    generations_stored: str | None = _key("generationsStored", "str")  # the major whose file is stored
    # Keys of another operator version, written back unchanged.
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"key": None, "kind": "extra"})

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> UpgradeState:
        """The state from the annotation's JSON object; ValueError naming the key that is wrong."""
        values: dict[str, Any] = {}
        known: set[str] = set()
        for f in dataclasses.fields(cls):
            key, kind = f.metadata["key"], f.metadata["kind"]
            if key is None:
                continue
            known.add(key)
            value = raw.get(key)
            if value is None:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"the upgrade's state has no {key!r}")
                continue
            values[f.name] = _parse(key, kind, value)
        values["extra"] = {k: v for k, v in raw.items() if k not in known}
        return cls(**values)

    @classmethod
    def from_annotation(cls, body: Mapping[str, Any]) -> UpgradeState | None:
        """The state the cluster `body` carries; None without one (or with one that is not a JSON object,
        as an older operator read it too). ValueError when the object's keys are wrong."""
        raw = objects.annotation(body, ANNOTATION)
        try:
            loaded = json.loads(raw) if raw else None
        except ValueError:
            return None
        return cls.from_mapping(loaded) if isinstance(loaded, dict) else None

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            key, value = f.metadata["key"], getattr(self, f.name)
            if key is not None and value is not None:
                out[key] = (
                    dict(value) if isinstance(value, Mapping) else str(value) if key == "phase" else value
                )
        return out

    def to_annotation(self) -> str:
        return json.dumps(self.to_mapping(), sort_keys=True)

    def moved(self, outcome: Outcome, **changes: Any) -> UpgradeState:
        """This state in the phase after `outcome`, with `changes`."""
        return dataclasses.replace(self, phase=next_phase(self.phase, outcome), **changes)

    def with_(self, **changes: Any) -> UpgradeState:
        """This state in the same phase, with `changes` (a step's progress)."""
        return dataclasses.replace(self, **changes)


def _parse(key: str, kind: str, value: Any) -> Any:
    wrong = ValueError(f"the upgrade's state has a wrong {key!r}: {value!r}")
    if kind == "phase":
        try:
            return Phase(value)
        except ValueError:
            raise wrong from None
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "str" and isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    if kind == "names" and isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return {str(k): v for k, v in value.items()}
    raise wrong


def current(saved: UpgradeState | None, remembered: UpgradeState | None) -> UpgradeState | None:
    """The state a reconcile acts on: the one this operator last saved (the watch cache may not show it yet),
    else the annotation's. None when the user removed the annotation of a settled upgrade: try again."""
    if remembered is None:
        return saved
    if saved is None and remembered.phase in SETTLED:
        return None
    return remembered


# --- what a reconcile does ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassPlan:
    state: UpgradeState
    begun: bool  # a new upgrade: its state is saved (and announced) before its first step


def plan_pass(
    state: UpgradeState | None, running: str | None, wanted: str, spec_image: str | None, now: float
) -> PassPlan | None:
    """The upgrade this reconcile works on, or None: nothing to upgrade (a new cluster, the data already on
    `wanted`, or `wanted` back at the running major). A new one begins when `spec.version` differs from
    the upgrade's target, or when `spec.image` changed before writes stopped. ValueError: `wanted` is
    lower than what runs."""
    if running is None or (running == wanted and (state is None or state.phase is Phase.DONE)):
        return None
    restart = state is not None and state.phase in IMAGE_RESTARTS and state.image != spec_image
    if state is not None and state.new_major == wanted and not restart:
        return PassPlan(state, begun=False)
    request = requested(wanted, running)
    if request is None:
        return None
    fresh = UpgradeState(request.old_major, request.new_major, Phase.CHECKING, started=now, image=spec_image)
    return PassPlan(fresh, begun=True)


def held_major(state: UpgradeState) -> str:
    """The major every other sub-reconciler builds the cluster at: the data's."""
    return state.new_major if state.phase in DATA_ON_NEW_MAJOR else state.old_major


def upgrade_image(state: UpgradeState) -> str:
    """The image of the new major: the spec's when the upgrade began with one, else the default."""
    return state.image or default_image(state.new_major)


def image_not_honoured(state: UpgradeState, spec_image: str | None) -> str | None:
    """Why `spec.image` is not what the running upgrade uses, or None: changed after writes stopped, it
    applies once the upgrade is done (a roll to it then, like any image change)."""
    if state.image == spec_image or state.phase in IMAGE_RESTARTS or state.phase is Phase.DONE:
        return None
    return (
        f"spec.image {spec_image or '(the default)'} is not used by the running upgrade to PostgreSQL "
        f"{state.new_major}, which checked and runs {upgrade_image(state)}: writes had stopped when it "
        "changed; it applies once the upgrade is done"
    )


def check_retry_in(state: UpgradeState, now: float) -> float:
    """Seconds until a failed check runs again (≤ 0: now)."""
    return (state.checked or 0.0) + CHECK_RETRY_SECONDS - now


def outage_start(state: UpgradeState) -> float | None:
    """When writes stopped: the stop's request (an upgrade begun by an older operator has only the
    moment every stop had returned)."""
    return state.stop_requested if state.stop_requested is not None else state.writes_stopped


def upgraded_system_identifier(exit_status: int, output: str) -> str | None:
    """The new cluster's system identifier the upgrade script printed, or None when it failed."""
    if exit_status != 0:
        return None
    lines = (ln.split(": ", 1)[1] for ln in output.splitlines() if ln.startswith("system identifier: "))
    return next(lines, None)


# --- the new major's image on the primary's volume ------------------------------------------------------


@dataclass(frozen=True)
class Staging:
    """How the new major's tree gets onto the primary's volume: an ephemeral container of `image`
    copies `source` (in that image) to the directory named by `tree`."""

    container: str
    image: str
    source: str
    tree: str  # the staged tree's name: orchestration.major_upgrade.staged_binaries(tree)


def staging(state: UpgradeState) -> Staging:
    """The operator's image of a major is staged under its exact version (`17.11`, from its own tree);
    an image of the user's under the major and a digest of the reference, from the tree its
    `/usr/lib/postgresql/current` link names (the layout the instance's image has)."""
    if state.image is None:
        version = BUILT_VERSIONS[state.new_major][0]
        return Staging(f"stage-{version.replace('.', '-')}", default_image(state.new_major),
                       f"/usr/lib/postgresql/{version}", version)  # fmt: skip
    tag = f"{state.new_major}-{hashlib.sha256(state.image.encode()).hexdigest()[:10]}"
    # The trailing slash: cp copies the directory the link names, not the link.
    return Staging(f"stage-{tag}", state.image, "/usr/lib/postgresql/current/", tag)


def staging_container(stage: Staging) -> dict[str, Any]:
    """The ephemeral container that copies the new major's tree onto the primary's volume. Its security
    context passes the `restricted` Pod Security level, as the instance's own container does: an
    ephemeral container is admitted against the namespace's level like any other. What `cp` said on
    failure is its termination message (the check's reason)."""
    target = staged_binaries(stage.tree)
    return {
        "name": stage.container,
        "image": stage.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "/bin/sh",
            "-c",
            f"rm -rf {target}.tmp && mkdir -p {WORK_DIR} && cp -a {stage.source} {target}.tmp && "
            f"rm -rf {target} && mv {target}.tmp {target}",
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsUser": 999,
            "runAsGroup": 999,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


# Container states that do not get better by waiting for the check's sake.
_STUCK: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class StagingResult:
    """Where the staging container is: absent (to be added), running, done, or failed with why."""

    absent: bool = False
    done: bool = False
    failed: str | None = None


def staging_result(pod: Mapping[str, Any], stage: Staging) -> StagingResult:
    """Read the staging container's status on the primary's pod."""
    for st in (pod.get("status") or {}).get("ephemeralContainerStatuses") or ():
        if st.get("name") != stage.container:
            continue
        terminated = (st.get("state") or {}).get("terminated")
        waiting = (st.get("state") or {}).get("waiting") or {}
        if terminated is not None:
            code = int(terminated.get("exitCode", 1))
            why = str(terminated.get("message") or "").strip()[-300:]
            return StagingResult(done=True) if code == 0 else StagingResult(failed=f"exit {code}: {why}")
        if waiting.get("reason") in _STUCK:
            return StagingResult(failed=f"{waiting['reason']}: {str(waiting.get('message') or '')[-300:]}")
        return StagingResult()
    spec = objects.spec(pod)
    present = any(c.get("name") == stage.container for c in spec.get("ephemeralContainers") or ())
    return StagingResult(absent=not present)


# --- the pods around the new major's start ------------------------------------------------------------


def replaced(instances: list[Instance], name: str, image: str) -> bool:
    """Whether the pod `name` has been recreated with `image` (a pod of the new major exists)."""
    return any(i.name == name and i.image == image and not i.terminating for i in instances)


def pods_to_recreate(instances: list[Instance], primary: str, image: str) -> list[str]:
    """The pods of the old image to delete now: the primary's first, the replicas' once its replacement
    exists (the primary's container is then created and started ahead of theirs)."""
    primary_replaced = replaced(instances, primary, image)
    return [
        i.name
        for i in instances
        if i.image != image and not i.terminating and (primary_replaced or i.name == primary)
    ]


def new_primary(instances: list[Instance], image: str) -> Instance | None:
    """The instance that leads on the new major once Patroni resumed. Not necessarily the upgraded
    primary: the leader key lapsed while the pods were recreated, and Patroni's race may go to a seeded
    replica, which holds the very same data (the primary's shutdown checkpoint, the same new cluster).
    An emptied replica cannot win it (it has nothing to start), nor can a pod of the old image."""
    leaders = (i for i in instances if i.image == image and i.role == ROLE_PRIMARY and i.ready)
    return next((i for i in leaders if not i.terminating), None)


def old_image_runs(instances: list[Instance], image: str) -> bool:
    """Whether a pod of another image than the new major's still runs: Patroni must stay paused (an
    old major's Patroni must never act on the emptied or upgraded data)."""
    return any(i.image != image and not i.terminating for i in instances)


def replicas_back(instances: list[Instance], replicas: int) -> bool:
    """Whether every instance of the spec is back and ready."""
    return len(instances) >= replicas and all(i.ready for i in instances)
