"""Leader election on a coordination.k8s.io/v1 Lease.

The decision is a pure function of what we last saw; expiry is judged on our own monotonic clock from the
moment the record last changed (as client-go does), so clock skew between nodes does not matter.
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
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from pg_operator.controller.kube import Api, is_conflict, is_not_found

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


class LeaseLost(Exception):
    """We held the Lease and can no longer prove it: the process must stop acting."""


@dataclass
class LeaseConfig:
    namespace: str
    name: str = "pg-operator-leader"
    identity: str = ""
    duration: int = 15
    renew_period: float = 2.0
    # Give up leadership if no renewal succeeded for this long; below `duration`, so we stop acting
    # before anybody else may take over.
    renew_deadline: float = 10.0


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
        self._last_renew = 0.0
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
        try:
            self._held = await self.api.replace(held)
        except ApiError as exc:
            self._held = None
            if is_conflict(exc):
                return None
            raise
        self._last_renew = self._now()
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
            raise
        if action is not Action.RENEW:
            log.info("leader lease %s/%s acquired by %s", cfg.namespace, cfg.name, cfg.identity)
        self._last_renew = self._now()
        return True

    async def acquire(self) -> None:
        """Wait until we hold the Lease."""
        while True:
            try:
                if await self.try_once():
                    self.is_leader = True
                    self.last_error = None
                    return
            except Exception as exc:  # API unreachable: keep trying, stay a candidate
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("leader election attempt failed: %s", self.last_error)
            # Candidates look twice per renew period, so a lapse is noticed soon after it happens.
            await asyncio.sleep(self.config.renew_period * (0.4 + 0.2 * random.random()))

    async def hold(self) -> None:
        """Renew until we cannot; raises LeaseLost then (never returns normally)."""
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.renew_period)
            try:
                if not await self.try_once():
                    self.is_leader = False
                    raise LeaseLost(f"lease {cfg.namespace}/{cfg.name} is held by someone else now")
                self.last_error = None
            except LeaseLost:
                raise
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("lease renewal failed: %s", self.last_error)
            if self._now() - self._last_renew > cfg.renew_deadline:
                self.is_leader = False
                raise LeaseLost(f"could not renew lease {cfg.namespace}/{cfg.name} for {cfg.renew_deadline}s")

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
