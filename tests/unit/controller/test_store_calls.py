"""Store calls are bounded and fair (controller/store_calls.py): a real boto3 client
against a local server that sends one byte every half second is cut off at the call's deadline, and a
namespace with a call in flight gets no second one while other namespaces do."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from pg_operator.backup.store_policy import StoreLimits
from pg_operator.controller import store_calls
from pg_operator.controller.store_calls import Slots, StoreBusy, StoreTimeout
from pg_operator.controller.store_client import StoreAccess, read_object
from pg_operator.controller.store_limits import configure, limits


@pytest.fixture
def dripping_server() -> Iterator[str]:
    """Accepts connections and sends one byte of a never-ending status line every 0.5 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.5):
                try:
                    conn.sendall(b"X")
                except OSError:
                    return

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    server.join()
    listener.close()


@pytest.fixture
def short_deadline() -> Iterator[None]:
    before = limits()
    configure(StoreLimits(call_seconds=2.0, allow_insecure=True))
    yield
    configure(before)


def _access(endpoint: str, namespace: str) -> StoreAccess:
    return StoreAccess(namespace=namespace, bucket="backups", prefix="prod/a/", endpoint_url=endpoint,
                       region="us-east-1", access_key_id="AKIATEST", secret_access_key="secret")  # fmt: skip


@pytest.mark.usefixtures("short_deadline")
def test_a_slow_drip_store_is_cut_off_at_the_deadline(dripping_server: str) -> None:
    async def call() -> None:
        await read_object(_access(dripping_server, "a"), "prod/a/marker.json")

    with pytest.raises(StoreTimeout):
        asyncio.run(call())
    # The slot came back with the thread: the namespace may call again.
    assert not store_calls.SLOTS.in_flight("a")


@pytest.mark.usefixtures("short_deadline")
def test_a_namespace_gets_one_call_in_flight_others_are_not_held(dripping_server: str) -> None:
    async def scenario() -> tuple[BaseException | None, bool]:
        slow = asyncio.create_task(read_object(_access(dripping_server, "a"), "k"))
        await asyncio.sleep(0.2)
        second: BaseException | None = None
        try:
            await read_object(_access(dripping_server, "a"), "k")
        except StoreBusy as exc:
            second = exc
        # Namespace b takes a slot of its own while a's call is still in flight.
        store_calls.SLOTS.take("b")
        b_ran = True
        store_calls.SLOTS.give_back("b")
        with pytest.raises(StoreTimeout):
            await slow
        return second, b_ran

    second, b_ran = asyncio.run(scenario())
    assert isinstance(second, StoreBusy)
    assert b_ran


def test_slots_are_capped_in_all() -> None:
    slots = Slots(total=2)
    slots.take("a")
    slots.take("b")
    with pytest.raises(StoreBusy):
        slots.take("c")
    with pytest.raises(StoreBusy):
        slots.take("a")
    slots.give_back("a")
    slots.take("c")
