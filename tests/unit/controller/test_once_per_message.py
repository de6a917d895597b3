"""One Warning per distinct message per cluster (controller/events.py OncePerMessage)."""

from __future__ import annotations

import asyncio
from typing import Any

from pg_operator.controller.events import OncePerMessage


class Recorder:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    async def record(self, cluster: dict[str, Any], event_type: str, reason: str, message: str) -> bool:
        self.posted.append((cluster["metadata"]["name"], reason, message))
        return True


def body(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": name}}


def test_the_same_message_posts_once_until_it_changes_or_is_forgotten() -> None:
    rec = Recorder()
    once = OncePerMessage(rec)  # type: ignore[arg-type]

    async def run() -> list[int]:
        return [
            await once.warn(body("a"), "R", "broken"),
            await once.warn(body("a"), "R", "broken"),
            await once.warn(body("b"), "R", "broken"),  # another cluster has its own
            await once.warn(body("a"), "R", "broken twice"),
            await once.warn(body("a"), "R", "broken"),
        ]

    assert asyncio.run(run()) == [1, 0, 1, 1, 1]
    once.forget(("shop", "a"))
    assert asyncio.run(once.warn(body("a"), "R", "broken")) == 1
    assert len(rec.posted) == 5
