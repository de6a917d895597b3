"""The work queue's two lanes: keys that completed a pass before go first, new keys are not starved."""

from __future__ import annotations

import asyncio

from pg_operator.controller.workqueue import WorkQueue, next_lane


def test_a_known_key_goes_first() -> None:
    assert next_lane(known_waiting=1, new_waiting=500, known_streak=0, known_burst=4) == "known"


def test_after_a_burst_of_known_keys_a_waiting_new_key_is_taken() -> None:
    assert next_lane(known_waiting=10, new_waiting=5, known_streak=3, known_burst=4) == "known"
    assert next_lane(known_waiting=10, new_waiting=5, known_streak=4, known_burst=4) == "new"


def test_a_lane_alone_is_always_served() -> None:
    assert next_lane(known_waiting=3, new_waiting=0, known_streak=99, known_burst=4) == "known"
    assert next_lane(known_waiting=0, new_waiting=3, known_streak=0, known_burst=4) == "new"
    assert next_lane(known_waiting=0, new_waiting=0, known_streak=0, known_burst=4) is None


async def drain(q: WorkQueue[str], order: list[str], count: int) -> None:
    for _ in range(count):
        key = await q.get()
        order.append(key)
        q.done(key)


async def test_a_change_to_a_converged_cluster_does_not_wait_behind_a_burst_of_new_ones() -> None:
    q: WorkQueue[str] = WorkQueue(known_burst=4)
    q.add("old")
    await drain(q, [], 1)  # "old" has had its pass: known from now on
    for i in range(200):
        q.add(f"new-{i}")
    q.add("old")  # the change, made after the burst was queued
    assert q.waiting() == {"known": 1, "new": 200}
    order: list[str] = []
    await drain(q, order, 201)
    assert order[0] == "old"  # a FIFO would have run it last
    assert order[1:] == [f"new-{i}" for i in range(200)]  # the new ones keep their order


async def test_new_keys_keep_a_share_while_known_keys_keep_coming() -> None:
    q: WorkQueue[str] = WorkQueue(known_burst=4)
    known = [f"k{i}" for i in range(10)]
    for key in known:
        q.add(key)
    await drain(q, [], len(known))
    for i in range(20):
        q.add(f"n{i}")
    order: list[str] = []
    for _ in range(50):
        for key in known:
            q.add(key)  # a steady stream of known work (coalesced while it waits)
        key = await q.get()
        order.append(key)
        q.done(key)
    new_taken = [k for k in order if k.startswith("n")]
    assert len(new_taken) == 10  # one in every five picks
    assert new_taken == [f"n{i}" for i in range(10)]
    assert all(order[i].startswith("n") for i in range(4, 50, 5))


async def test_a_key_added_while_it_runs_runs_again_in_the_known_lane() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    assert q.waiting() == {"known": 0, "new": 0}  # not queued twice while it runs
    q.done(key)
    assert q.waiting() == {"known": 1, "new": 0}
    assert len(q) == 1


async def test_a_worker_waits_for_work_and_wakes_when_it_comes() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    q.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_forgotten_keys_past_the_bound_only_lose_their_priority() -> None:
    q: WorkQueue[str] = WorkQueue(max_known=4)
    for i in range(5):
        q.add(f"k{i}")
    await drain(q, [], 5)  # the fifth pushes the oldest half out
    q.add("k0")
    q.add("k4")
    assert q.waiting() == {"known": 1, "new": 1}
    order: list[str] = []
    await drain(q, order, 2)
    assert order == ["k4", "k0"]
