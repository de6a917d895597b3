"""kopf's per-object memories: none kept, each event gets a fresh one."""

from __future__ import annotations

from typing import cast

import kopf

from pg_operator.controller.kopf_memories import ForgetfulMemories


def _body(uid: str) -> kopf.RawBody:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n", "uid": uid}}


async def test_recall_keeps_nothing() -> None:
    memories = ForgetfulMemories()
    first = await memories.recall(_body("u1"), noticed_by_listing=True)
    second = await memories.recall(_body("u1"))
    assert first is not second
    assert first.noticed_by_listing and not second.noticed_by_listing
    assert list(memories.iter_all_memories()) == []
    await memories.forget(_body("u1"))  # nothing to forget, and no error
    assert list(memories.iter_all_memories()) == []


async def test_memo_still_copied_from_the_base() -> None:
    base = kopf.Memo(setting="x")
    memory = await ForgetfulMemories().recall(_body("u2"), memobase=base)
    memo = cast(kopf.Memo, memory.memo)
    assert memo is not base
    assert memo["setting"] == "x"
