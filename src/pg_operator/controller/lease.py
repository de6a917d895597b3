"""Leader election on a coordination.k8s.io/v1 Lease.

The decision is a pure function of what we last saw; expiry is judged on our own monotonic clock from the
moment the record last changed (as client-go does), so clock skew between nodes does not matter.

The holder judges its own lease the same way from the other side: a renewal sent at monotonic time t
(and answered with success) means no candidate can see the record change before t, so none may take it
before t + duration. The holder keeps retrying a failed or slow renewal until then (less a margin for
stopping in-flight work), and only then stops acting — one slow answer from a starved API server is not
a lost lease.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from dataclasses import dataclass
from datetime import UTC, datetime

from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.coordination_v1 import Lease

from pg_operator.controller.kube_api import Api, is_conflict, is_not_found

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: int
    renew_time: datetime | None
    transitions: int


class Action(enum.Enum):
    CREATE = "create"  # no Lease object yet
    RENEW = "renew"  # we hold it
    TAKE = "take"  # free or expired: take it over
    WAIT = "wait"  # someone else holds it and it has not expired


def decide(identity: str, record: LeaseRecord | None, last_change: float, now: float) -> Action:
    """What a candidate should do, given the record and when (monotonic) it last changed."""
    if record is None:
        return Action.CREATE
    if record.holder == identity:
        return Action.RENEW
    if not record.holder:
        return Action.TAKE
    if now - last_change > record.duration:
        return Action.TAKE
    return Action.WAIT


@dataclass(frozen=True)
class Renewal:
    """What the holder does next: stop acting (`lost`), or wait `delay` seconds and then try a renewal
    that may take at most `timeout` seconds (after that our lease could have expired)."""

    lost: bool
    delay: float = 0.0
    timeout: float = 0.0


def plan_renewal(
    now: float,
    renewed_at: float,
    *,
    duration: float,
    margin: float,
    renew_period: float,
    retry_period: float,
    failed: bool,
) -> Renewal:
    """The holder's next step. `renewed_at` is when (monotonic, ours) the last successful renewal was
    sent; the lease is ours for sure until renewed_at + duration, and we stop `margin` seconds before
    that. After a failure the next try comes sooner (`retry_period`)."""
    valid_until = renewed_at + duration - margin
    left = valid_until - now
    if left <= 0:
        return Renewal(lost=True)
    delay = min(retry_period if failed else renew_period, left)
    # An attempt must answer before the lease could lapse; a try with (almost) no time left is pointless
    # but harmless, the next plan says lost.
    return Renewal(lost=False, delay=delay, timeout=max(valid_until - (now + delay), 0.0))


class LeaseLost(Exception):
    """We held the Lease and can no longer prove it: the process must stop acting."""


class LeaseNamespaceMissing(Exception):
    """The Lease's namespace does not exist: no retry can help (first contact out of cluster, where the
    default namespace comes from deploy/), so the candidate stops with what to do."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f'namespace "{namespace}" for the leader Lease does not exist: create it '
            f"(kubectl create namespace {namespace}, or kubectl apply -k deploy/) "
            "or pass --lease-namespace with an existing one"
        )
        self.namespace = namespace


def missing_namespace(status: Status | None) -> str | None:
    """The namespace a refused create names as not found (HTTP 404, details kind `namespaces`), else
    None (a 404 of the Lease itself is an ordinary first start)."""
    if status is None or status.code != 404 or status.details is None:
        return None
    if status.details.kind != "namespaces":
        return None
    return status.details.name or None


@dataclass
class LeaseConfig:
    namespace: str
    name: str = "pg-operator-leader"
    identity: str = ""
    duration: int = 15
    renew_period: float = 2.0
    # After a failed or timed-out renewal, try again this soon.
    retry_period: float = 0.5
    # Stop acting this long before our lease could expire (duration after the last successful renewal
    # was sent): time to cancel in-flight work before anybody else may take over.
    expiry_margin: float = 2.0


def _record(lease: Lease) -> LeaseRecord | None:
    spec = lease.spec
    if spec is None:
        return None
    return LeaseRecord(
        holder=spec.holderIdentity or "",
        duration=spec.leaseDurationSeconds or 15,
        renew_time=spec.renewTime,
        transitions=spec.leaseTransitions or 0,
    )


class LeaseElector:
    def __init__(self, api: Api, config: LeaseConfig) -> None:
        self.api = api
        self.config = config
        self.is_leader = False
        self._seen: tuple[str | None, float] = (None, 0.0)  # (resourceVersion, monotonic time first seen)
        self._renewed_at = 0.0  # monotonic time the last successful write of ours was *sent*
        self._held: Lease | None = None  # the Lease as our last successful write returned it
        self.last_error: str | None = None

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _spec(self, transitions: int, acquire: datetime | None) -> LeaseSpec:
        now = datetime.now(UTC)
        return LeaseSpec(
            holderIdentity=self.config.identity,
            leaseDurationSeconds=self.config.duration,
            acquireTime=acquire or now,
            renewTime=now,
            leaseTransitions=transitions,
        )

    async def _renew_held(self) -> bool | None:
        """Renew from the object our last write returned (one request, no GET). None: we need a fresh
        look (no such object, or somebody else wrote the Lease since)."""
        held = self._held
        if held is None or held.spec is None:
            return None
        held.spec = self._spec(held.spec.leaseTransitions or 0, held.spec.acquireTime)
        sent = self._now()
        self._held = None  # until the write is answered: a cancelled write leaves an unknown version
        try:
            self._held = await self.api.replace(held)
        except ApiError as exc:
            if is_conflict(exc):
                return None
            raise
        self._renewed_at = sent
        return True

    async def try_once(self) -> bool:
        """One round of the state machine; True when we hold the Lease afterwards."""
        cfg = self.config
        if self.is_leader:
            renewed = await self._renew_held()
            if renewed is not None:
                return renewed
        try:
            lease = await self.api.get(Lease, cfg.name, cfg.namespace)
        except ApiError as exc:
            if not is_not_found(exc):
                raise
            lease = None
        record = _record(lease) if lease is not None else None
        if lease is not None:
            rv = lease.metadata.resourceVersion if lease.metadata else None
            if rv != self._seen[0]:
                self._seen = (rv, self._now())
        action = decide(cfg.identity, record, self._seen[1], self._now())
        sent = self._now()
        try:
            if action is Action.CREATE:
                self._held = await self.api.create(
                    Lease(
                        metadata=ObjectMeta(name=cfg.name, namespace=cfg.namespace), spec=self._spec(0, None)
                    )
                )
            elif action is Action.RENEW:
                assert lease is not None and record is not None
                lease.spec = self._spec(record.transitions, lease.spec.acquireTime if lease.spec else None)
                self._held = await self.api.replace(lease)
            elif action is Action.TAKE:
                assert lease is not None and record is not None
                lease.spec = self._spec(record.transitions + 1, None)
                self._held = await self.api.replace(lease)
            else:
                return False
        except ApiError as exc:
            if is_conflict(exc):  # somebody else wrote it first (optimistic concurrency on resourceVersion)
                return False
            namespace = missing_namespace(exc.status) if action is Action.CREATE else None
            if namespace is not None:
                raise LeaseNamespaceMissing(namespace) from None
            raise
        if action is not Action.RENEW:
            log.info("leader lease %s/%s acquired by %s", cfg.namespace, cfg.name, cfg.identity)
        self._renewed_at = sent
        return True

    async def acquire(self) -> None:
        """Wait until we hold the Lease."""
        while True:
            try:
                if await self.try_once():
                    self.is_leader = True
                    self.last_error = None
                    return
            except LeaseNamespaceMissing:
                raise  # waiting cannot help: the caller stops with what to do
            except Exception as exc:  # API unreachable: keep trying, stay a candidate
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("leader election attempt failed: %s", self.last_error)
            # Candidates look twice per renew period, so a lapse is noticed soon after it happens.
            await asyncio.sleep(self.config.renew_period * (0.4 + 0.2 * random.random()))

    async def hold(self) -> None:
        """Renew until we cannot; raises LeaseLost then (never returns normally). A failed or slow
        renewal is retried until the lease, as we last wrote it, could have expired by our own clock."""
        cfg = self.config
        failed = False
        while True:
            plan = plan_renewal(
                self._now(),
                self._renewed_at,
                duration=cfg.duration,
                margin=cfg.expiry_margin,
                renew_period=cfg.renew_period,
                retry_period=cfg.retry_period,
                failed=failed,
            )
            if plan.lost:
                self.is_leader = False
                raise LeaseLost(
                    f"could not renew lease {cfg.namespace}/{cfg.name} before it could expire "
                    f"(last renewal sent {self._now() - self._renewed_at:.1f}s ago, duration {cfg.duration}s)"
                )
            await asyncio.sleep(plan.delay)
            try:
                held = await asyncio.wait_for(self.try_once(), timeout=max(plan.timeout, 0.01))
            except TimeoutError:
                failed = True
                self.last_error = f"renewal not answered within {plan.timeout:.1f}s"
                log.warning("lease renewal failed: %s", self.last_error)
                continue
            except Exception as exc:
                failed = True
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("lease renewal failed: %s", self.last_error)
                continue
            if not held:
                self.is_leader = False
                raise LeaseLost(f"lease {cfg.namespace}/{cfg.name} is held by someone else now")
            if failed:
                log.info("lease renewed again after a failure")
            failed = False
            self.last_error = None

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        cfg = self.config
        try:
            lease = await self.api.get(Lease, cfg.name, cfg.namespace)
            if lease.spec and lease.spec.holderIdentity == cfg.identity:
                lease.spec.holderIdentity = ""
                lease.spec.leaseDurationSeconds = 1
                await self.api.replace(lease)
        except Exception as exc:
            log.warning("could not release the lease: %s", exc)
