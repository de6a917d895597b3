"""One shared wait for kopf's "every object is indexed" gate, so an operator start is not quadratic.

kopf (1.45) gives every object of the initial listing a worker; each indexes its object, drops its own
toggle from the operator's `ToggleSet(all)` and then waits in `ToggleSet.wait_for(True)` until the rest
are indexed too. That wait is an `asyncio.Condition`: each toggle change (one or two per listed object)
wakes every worker waiting so far, so N objects cost about N²/2 wake-ups. Measured (a toggle set fed the
way a listing feeds it, `tests/unit/test_kopf_toggles.py` counts the checks): 8 s of CPU for 1,000
objects, 26 to 36 s for 2,000; the scale bench's 3,002 claims held the operator's first reconcile for
70 s (66 s of CPU), and 1,000 clusters (~21,000 labelled objects) would hold it for about an hour
(extrapolated).

`install()` replaces `ToggleSet.wait_for` with one where all waiters for the same set and state share a
single task that waits on the condition: each change wakes that one task, and the N waiters are woken
once, when the state is reached. Same result and order of events for every caller; only the number of
wake-ups changes. If kopf's internals are not what this was written against, nothing is replaced and a
warning says so (the operator then works as before, slowly at startup).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kopf._cogs.aiokits import aiotoggles

log = logging.getLogger(__name__)

WaitFor = Callable[[aiotoggles.ToggleSet, bool], Coroutine[Any, Any, None]]
_MARK = "_pg_operator_shared_wait"


@dataclass
class _SharedWait:
    task: asyncio.Task[None]
    waiters: int = field(default=0)


def shared_wait_for(original: WaitFor) -> WaitFor:
    """A `wait_for` whose concurrent callers (same set, same state) share one wait on the condition."""
    shared: weakref.WeakKeyDictionary[aiotoggles.ToggleSet, dict[bool, _SharedWait]] = (
        weakref.WeakKeyDictionary()
    )

    async def wait_for(self: aiotoggles.ToggleSet, state: bool) -> None:
        state = bool(state)
        if self.is_on() == state:
            return
        per_set = shared.setdefault(self, {})
        wait = per_set.get(state)
        if wait is None or wait.task.done():
            wait = per_set[state] = _SharedWait(asyncio.create_task(original(self, state)))
        wait.waiters += 1
        try:
            await asyncio.shield(wait.task)
        finally:
            wait.waiters -= 1
            if wait.waiters == 0 and not wait.task.done():
                # Every caller was cancelled: nobody needs the answer, so the shared wait goes too.
                wait.task.cancel()
                if per_set.get(state) is wait:
                    del per_set[state]

    setattr(wait_for, _MARK, True)
    return wait_for


def install() -> bool:
    """Replace kopf's `ToggleSet.wait_for` once; False (and a warning) if kopf is not as expected."""
    current = aiotoggles.ToggleSet.wait_for
    if getattr(current, _MARK, False):
        return True
    params = list(inspect.signature(current).parameters)
    expected = inspect.iscoroutinefunction(current) and len(params) == 2 and hasattr(aiotoggles, "Toggle")
    if not expected:
        log.warning("kopf's ToggleSet.wait_for is not the one known; its startup wait stays quadratic")
        return False
    aiotoggles.ToggleSet.wait_for = shared_wait_for(current)  # type: ignore[method-assign,assignment]
    return True
