"""kopf's per-object memories, kept for no object.

kopf remembers a `ResourceMemory` for every object it has seen an event of (a memo, an error throttler,
indexing and daemon state; about 0.9 KiB each) until the object is deleted: about 28 objects per
cluster, 25 MiB at 1000 clusters, for state this operator never uses. Its registry holds only
`on.event` handlers (`wakeups.build_registry` refuses change-detecting ones, daemons and timers; no
indexes, no webhooks), and they read neither `memo` nor any state of a previous event. kopf's own
"ephemeral" recall (meant for admission webhooks) gives a fresh memory per event without storing it.

What is given up: kopf's error throttler, which delays an object whose event processing failed outside
a handler, keeps its escalation from one event to the next only within one event now; a failure still
sleeps the first of `settings.queueing.error_delays` before the worker takes the next event.
"""

from __future__ import annotations

from typing import Any

# Not exported by kopf's top-level package; `kopf.operator(memories=...)` takes an instance of it.
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory


class ForgetfulMemories(ResourceMemories):
    """Every recall is ephemeral: a fresh memory for this event, stored nowhere."""

    async def recall(
        self,
        raw_body: Any,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> ResourceMemory:
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True
        )
