"""Secrets read by name once a cluster comes to name them: each found one is delivered, and the cluster's
pass comes after the last read, whatever each gave (found, missing, failed)."""

from __future__ import annotations

import asyncio
from typing import Any

from pg_operator.controller.secret_reads import SecretReader


def test_the_pass_comes_after_every_read_found_missing_or_failed() -> None:
    order: list[str] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0.01)
        if name == "broken":
            raise OSError("connection reset")
        return None if name == "missing" else {"metadata": {"name": name, "namespace": namespace}}

    async def run() -> None:
        reader = SecretReader(read, lambda body: order.append(f"delivered {body['metadata']['name']}"))
        reader.read(("shop", "orders-db"), ["tls-cert", "missing", "broken", "app-pw"],
                    then=lambda: order.append("woken"))  # fmt: skip
        await reader.drain()

    asyncio.run(run())
    assert order == ["delivered app-pw", "delivered tls-cert", "woken"]
