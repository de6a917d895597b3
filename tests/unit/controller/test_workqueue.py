"""The work queue's three lanes: settled keys first, then keys whose pass is underway, then new keys;
no lane starves; a key's lane is what its handler said of its last pass."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from pg_operator.controller.workqueue import Lane, WorkQueue, next_lane, passed_over_after


def lanes(settled: int = 0, underway: int = 0, new: int = 0) -> dict[Lane, int]:
    return {"settled": settled, "underway": underway, "new": new}


def test_the_first_lane_with_a_key_waiting_goes_first() -> None:
    assert next_lane(lanes(1, 1, 500), lanes(), burst=4) == "settled"
    assert next_lane(lanes(0, 1, 500), lanes(), burst=4) == "underway"
    assert next_lane(lanes(0, 0, 500), lanes(), burst=4) == "new"
    assert next_lane(lanes(), lanes(), burst=4) is None


def test_a_lane_passed_over_burst_times_takes_the_next_pick() -> None:
    assert next_lane(lanes(10, 10, 5), lanes(new=3), burst=4) == "settled"
    assert next_lane(lanes(10, 10, 5), lanes(new=4), burst=4) == "new"
    assert next_lane(lanes(10, 10, 5), lanes(underway=4), burst=4) == "underway"
    # Both overdue: the lowest lane first.
    assert next_lane(lanes(10, 10, 5), lanes(underway=4, new=4), burst=4) == "new"
    # Overdue but empty: the order holds.
    assert next_lane(lanes(3, 0, 0), lanes(underway=9, new=9), burst=4) == "settled"


def test_only_a_lower_lane_that_waits_is_counted_as_passed_over() -> None:
    after = passed_over_after("settled", lanes(5, 0, 2), lanes(underway=1, new=1))
    assert after == lanes(0, 1, 2)  # underway had nothing waiting: not passed over
    after = passed_over_after("underway", lanes(5, 1, 2), lanes(underway=3, new=2))
    assert after == lanes(0, 0, 3)  # a pick is not counted against the lanes above it
    assert passed_over_after("new", lanes(1, 1, 1), lanes(0, 2, 4)) == lanes(0, 2, 0)


async def drain(
    q: WorkQueue[str], order: list[str], count: int, said: Mapping[str, Lane] | None = None
) -> None:
    """Take `count` keys; each pass says `said[key]` of its key ("new" when not named)."""
    for _ in range(count):
        key = await q.get()
        order.append(key)
        q.done(key, (said or {}).get(key, "new"))


async def test_a_change_to_a_converged_cluster_does_not_wait_behind_a_burst_of_new_ones() -> None:
    q: WorkQueue[str] = WorkQueue(burst=4)
    q.add("old")
    await drain(q, [], 1, {"old": "settled"})  # its pass found it converged
    for i in range(200):
        q.add(f"new-{i}")
    q.add("old")  # the change, made after the burst was queued
    assert q.waiting() == lanes(1, 0, 200)
    order: list[str] = []
    await drain(q, order, 201)
    assert order[0] == "old"  # one FIFO would have run it last
    assert order[1:] == [f"new-{i}" for i in range(200)]  # the others keep their order


async def test_a_cluster_underway_comes_back_before_the_rest_of_a_burst() -> None:
    # The pass that finds a new cluster's pods ready (and reports Ready) does not wait for the first
    # pass of every other new cluster.
    q: WorkQueue[str] = WorkQueue(burst=4)
    for i in range(100):
        q.add(f"c{i}")
    order: list[str] = []
    await drain(q, order, 2, {"c0": "underway", "c1": "underway"})  # their children are written
    q.add("c1")  # its pods became ready
    q.add("c0")
    assert q.waiting() == lanes(0, 2, 98)
    await drain(q, order, 4)
    assert order == ["c0", "c1", "c1", "c0", "c2", "c3"]


async def test_a_key_processed_without_being_acted_on_gets_no_priority() -> None:
    # At 1000 clusters every key had a pass before its cluster existed: processed is not underway.
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b"):
        q.add(key)
    await drain(q, [], 2)  # passes that found no cluster
    q.add("b")
    q.add("a")
    assert q.waiting() == lanes(0, 0, 2)
    order: list[str] = []
    await drain(q, order, 2)
    assert order == ["b", "a"]


async def test_a_key_takes_the_lane_its_last_pass_said() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await drain(q, [], 1, {"a": "settled"})
    q.add("a")
    await drain(q, [], 1, {"a": "underway"})  # this pass wrote something: not settled any more
    q.add("a")
    assert q.waiting() == lanes(0, 1, 0)
    await drain(q, [], 1)  # gone
    q.add("a")
    assert q.waiting() == lanes(0, 0, 1)


async def test_lower_lanes_keep_a_share_while_settled_keys_keep_coming() -> None:
    q: WorkQueue[str] = WorkQueue(burst=4)
    settled: dict[str, Lane] = {f"k{i}": "settled" for i in range(10)}
    for key in sorted(settled):
        q.add(key)
    await drain(q, [], len(settled), settled)
    for i in range(20):
        q.add(f"n{i}")
    order: list[str] = []
    for _ in range(50):
        for key in sorted(settled):
            q.add(key)  # a steady stream of settled work (coalesced while it waits)
        key = await q.get()
        order.append(key)
        q.done(key, "settled" if key in settled else "new")
    new_taken = [k for k in order if k.startswith("n")]
    assert len(new_taken) == 10  # one in every five picks
    assert new_taken == [f"n{i}" for i in range(10)]
    assert all(order[i].startswith("n") for i in range(4, 50, 5))


async def test_new_keys_keep_a_share_while_clusters_underway_keep_coming() -> None:
    q: WorkQueue[str] = WorkQueue(burst=2)
    busy = [f"u{i}" for i in range(4)]
    for key in busy:
        q.add(key)
    for i in range(10):
        q.add(f"n{i}")
    order: list[str] = []
    for _ in range(4):  # the busy keys' first passes: new, and they come out underway
        key = await q.get()
        order.append(key)
        q.done(key, "underway" if key in busy else "new")
    for _ in range(30):
        for key in busy:
            q.add(key)
        key = await q.get()
        order.append(key)
        q.done(key, "underway" if key in busy else "new")
    assert order[:4] == busy
    taken = [k for k in order[4:] if k.startswith("n")]
    assert taken == [f"n{i}" for i in range(10)]  # one in three picks, in order
    assert all(order[4 + i].startswith("n") for i in range(2, 30, 3))


async def test_the_handlers_answer_decides_the_lane() -> None:
    q: WorkQueue[str] = WorkQueue()
    passes: list[str] = []
    said: dict[str, Lane | None] = {"converged": "settled", "busy": "underway", "missing": None}

    async def handler(key: str) -> Lane | None:
        passes.append(key)
        return said[key]

    task = asyncio.create_task(q.run_workers(handler, workers=1))
    for key in said:
        q.add(key)
    await asyncio.sleep(0.05)
    assert passes == list(said)
    task.cancel()
    for key in said:
        q.add(key)
    assert q.waiting() == lanes(1, 1, 1)


async def test_a_key_added_while_it_runs_runs_again() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    assert q.waiting() == lanes()  # not queued twice while it runs
    q.done(key, "settled")
    assert q.waiting() == lanes(settled=1)
    assert len(q) == 1


async def test_a_worker_waits_for_work_and_wakes_when_it_comes() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    q.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_forgotten_keys_past_the_bound_only_lose_their_priority() -> None:
    q: WorkQueue[str] = WorkQueue(max_remembered=4)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        q.add(key)
    await drain(q, [], 5, dict.fromkeys(keys, "settled"))  # the fifth pushes the oldest half out
    q.add("k0")
    q.add("k4")
    assert q.waiting() == lanes(settled=1, new=1)
    order: list[str] = []
    await drain(q, order, 2)
    assert order == ["k4", "k0"]
