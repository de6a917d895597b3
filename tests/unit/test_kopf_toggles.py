"""kopf's startup gate with one shared wait: same outcome, wake-ups linear in the number of objects."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles

from pg_operator.controller.kopf_toggles import install, shared_wait_for

ORIGINAL = aiotoggles.ToggleSet.wait_for
SHARED = shared_wait_for(ORIGINAL)


class Counted:
    """`all`, counting how often the gate is checked (one check per waiter woken)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, states: Iterable[bool]) -> bool:
        self.calls += 1
        return all(states)


async def listing(objects: int, wait_for: object) -> int:
    """Feed a toggle set the way kopf's initial listing does; return how often the gate was checked."""
    check = Counted()
    gate = aiotoggles.ToggleSet(check)
    kind = await gate.make_toggle(name="kind")  # the kind's listing is not over yet
    released: list[int] = []

    async def worker(i: int, own: aiotoggles.Toggle) -> None:
        await gate.drop_toggle(own)  # this object is indexed
        await wait_for(gate, True)  # type: ignore[operator]
        released.append(i)

    tasks = []
    for i in range(objects):  # objects arrive one by one from the stream
        own = await gate.make_toggle(name=str(i))
        tasks.append(asyncio.create_task(worker(i, own)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert released == []  # nobody passes the gate before the listing ends
    await gate.drop_toggle(kind)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert sorted(released) == list(range(objects))
    return check.calls


def test_kopf_as_released_checks_the_gate_quadratically() -> None:
    # Why the replacement exists; if kopf fixes this upstream, this fails and the module can go.
    checks = {n: asyncio.run(listing(n, ORIGINAL)) for n in (100, 200)}
    assert checks[200] > 3 * checks[100]
    assert checks[200] > 200 * 200 / 4


def test_one_shared_wait_checks_the_gate_linearly_and_releases_everyone() -> None:
    checks = {n: asyncio.run(listing(n, SHARED)) for n in (100, 200, 400)}
    assert checks[400] < 2.5 * checks[200] < 6.25 * checks[100]
    assert checks[400] < 10 * 400


def test_waiting_for_a_state_already_reached_returns_at_once() -> None:
    async def scenario() -> None:
        gate = aiotoggles.ToggleSet(all)  # no toggles: on
        await asyncio.wait_for(SHARED(gate, True), timeout=1)
        toggle = await gate.make_toggle(False)
        await asyncio.wait_for(SHARED(gate, False), timeout=1)
        await toggle.turn_to(True)
        await asyncio.wait_for(SHARED(gate, True), timeout=1)

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_others_waiting_and_the_last_one_ends_the_shared_wait() -> None:
    async def scenario() -> None:
        gate = aiotoggles.ToggleSet(all)
        toggle = await gate.make_toggle(False)
        first = asyncio.create_task(SHARED(gate, True))
        second = asyncio.create_task(SHARED(gate, True))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        assert first.cancelled() and not second.done()
        await toggle.turn_to(True)
        await asyncio.wait_for(second, timeout=1)

        # Everyone cancelled: the shared task goes too, and a later wait starts a fresh one.
        await toggle.turn_to(False)
        lone = asyncio.create_task(SHARED(gate, True))
        await asyncio.sleep(0.01)
        lone.cancel()
        await asyncio.sleep(0.01)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert pending == []
        later = asyncio.create_task(SHARED(gate, True))
        await asyncio.sleep(0.01)
        await toggle.turn_to(True)
        await asyncio.wait_for(later, timeout=1)

    asyncio.run(scenario())


def test_install_replaces_kopfs_wait_once() -> None:
    try:
        assert install() is True
        replaced = aiotoggles.ToggleSet.wait_for
        assert replaced is not ORIGINAL
        assert install() is True
        assert aiotoggles.ToggleSet.wait_for is replaced
    finally:
        aiotoggles.ToggleSet.wait_for = ORIGINAL  # type: ignore[method-assign]
