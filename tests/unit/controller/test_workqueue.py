"""The work queue's two lanes: keys whose last pass found them settled go first, the others are not
starved, and a key is settled only when its handler says so."""

from __future__ import annotations

import asyncio

from pg_operator.controller.workqueue import WorkQueue, next_lane


def test_a_settled_key_goes_first() -> None:
    assert next_lane(settled_waiting=1, other_waiting=500, settled_streak=0, settled_burst=4) == "settled"


def test_after_a_burst_of_settled_keys_a_waiting_other_key_is_taken() -> None:
    assert next_lane(settled_waiting=10, other_waiting=5, settled_streak=3, settled_burst=4) == "settled"
    assert next_lane(settled_waiting=10, other_waiting=5, settled_streak=4, settled_burst=4) == "other"


def test_a_lane_alone_is_always_served() -> None:
    assert next_lane(settled_waiting=3, other_waiting=0, settled_streak=99, settled_burst=4) == "settled"
    assert next_lane(settled_waiting=0, other_waiting=3, settled_streak=0, settled_burst=4) == "other"
    assert next_lane(settled_waiting=0, other_waiting=0, settled_streak=0, settled_burst=4) is None


async def drain(
    q: WorkQueue[str], order: list[str], count: int, settled: frozenset[str] | set[str] = frozenset()
) -> None:
    for _ in range(count):
        key = await q.get()
        order.append(key)
        q.done(key, settled=key in settled)


async def test_a_change_to_a_converged_cluster_does_not_wait_behind_a_burst_of_new_ones() -> None:
    q: WorkQueue[str] = WorkQueue(settled_burst=4)
    q.add("old")
    await drain(q, [], 1, settled={"old"})  # its pass found it converged
    for i in range(200):
        q.add(f"new-{i}")
    q.add("old")  # the change, made after the burst was queued
    assert q.waiting() == {"settled": 1, "other": 200}
    order: list[str] = []
    await drain(q, order, 201)
    assert order[0] == "old"  # one FIFO would have run it last
    assert order[1:] == [f"new-{i}" for i in range(200)]  # the others keep their order


async def test_a_key_processed_without_being_settled_gets_no_priority() -> None:
    # At 1000 clusters every key had a pass before its cluster existed: processed is not settled.
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b"):
        q.add(key)
    await drain(q, [], 2)  # passes that did not find their cluster converged
    q.add("b")
    q.add("a")
    assert q.waiting() == {"settled": 0, "other": 2}
    order: list[str] = []
    await drain(q, order, 2)
    assert order == ["b", "a"]


async def test_a_settled_key_that_changes_loses_its_priority_after_an_unsettled_pass() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await drain(q, [], 1, settled={"a"})
    q.add("a")
    await drain(q, [], 1)  # this pass wrote something: not settled any more
    q.add("a")
    assert q.waiting() == {"settled": 0, "other": 1}


async def test_other_keys_keep_a_share_while_settled_keys_keep_coming() -> None:
    q: WorkQueue[str] = WorkQueue(settled_burst=4)
    settled = {f"k{i}" for i in range(10)}
    for key in sorted(settled):
        q.add(key)
    await drain(q, [], len(settled), settled=settled)
    for i in range(20):
        q.add(f"n{i}")
    order: list[str] = []
    for _ in range(50):
        for key in sorted(settled):
            q.add(key)  # a steady stream of settled work (coalesced while it waits)
        key = await q.get()
        order.append(key)
        q.done(key, settled=key in settled)
    new_taken = [k for k in order if k.startswith("n")]
    assert len(new_taken) == 10  # one in every five picks
    assert new_taken == [f"n{i}" for i in range(10)]
    assert all(order[i].startswith("n") for i in range(4, 50, 5))


async def test_the_handlers_answer_decides_the_lane() -> None:
    q: WorkQueue[str] = WorkQueue()
    passes: list[str] = []

    async def handler(key: str) -> bool:
        passes.append(key)
        return key == "converged"

    task = asyncio.create_task(q.run_workers(handler, workers=1))
    q.add("converged")
    q.add("busy")
    await asyncio.sleep(0.05)
    assert passes == ["converged", "busy"]
    task.cancel()
    for key in ("busy", "converged"):
        q.add(key)
    assert q.waiting() == {"settled": 1, "other": 1}


async def test_a_key_added_while_it_runs_runs_again() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    assert q.waiting() == {"settled": 0, "other": 0}  # not queued twice while it runs
    q.done(key, settled=True)
    assert q.waiting() == {"settled": 1, "other": 0}
    assert len(q) == 1


async def test_a_worker_waits_for_work_and_wakes_when_it_comes() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    q.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_forgotten_keys_past_the_bound_only_lose_their_priority() -> None:
    q: WorkQueue[str] = WorkQueue(max_settled=4)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        q.add(key)
    await drain(q, [], 5, settled=set(keys))  # the fifth pushes the oldest half out
    q.add("k0")
    q.add("k4")
    assert q.waiting() == {"settled": 1, "other": 1}
    order: list[str] = []
    await drain(q, order, 2)
    assert order == ["k4", "k0"]
