"""How the operator's own calls to tenants' object stores run: bounded and fair.

- Each call (every request it makes, retries included) has an overall deadline. A socket timeout alone
  does not bound a store that sends one byte every few seconds, so the requests are sent by this module
  (botocore's `before-send` hook: botocore still builds and signs them) over a socket it owns, and a
  watchdog shuts that socket at the deadline: the blocked read returns and the call fails as
  StoreTimeout. Nothing waits past the deadline, and no thread stays behind.
- The calls run on a pool of their own (never the event loop's default executor, which other work
  shares), at most one call in flight per namespace and at most `POOL_SIZE` in all: a slow or hostile
  store delays only its own namespace's clusters. A call that finds its namespace's slot (or the pool)
  taken fails at once as StoreBusy and the reconcile comes back shortly, so no reconcile worker waits on
  another tenant's store.
The limits are the operator's flags, set once at start (controller/store_limits.py)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pg_operator.backup.store_policy import Deadline, Refusal
from pg_operator.controller.store_limits import limits

T = TypeVar("T")

POOL_SIZE = 8  # store calls in flight at once, over all namespaces
BUSY_RETRY_SECONDS = 3.0  # a reconcile whose namespace's slot was taken comes back after this


class StoreError(Exception):
    """A failed store call; str() is the store's error (no secret values)."""


class StoreTimeout(StoreError):
    """The call did not finish by its deadline; the connection was cut."""


class StoreBusy(StoreError):
    """The namespace already has a store call in flight (or the pool is full): come back shortly."""


class StoreRefused(StoreError):
    """The operator will not call this store: plain HTTP not allowed, or credentials not labelled for the
    cluster. Nothing was sent."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


# --- fairness ---------------------------------------------------------------------------------------------


class Slots:
    """At most one call in flight per namespace and `total` in all. Taken without waiting (a reconcile that
    cannot have one is asked to come back: it never holds a reconcile worker while another namespace's
    store answers slowly). Plain counters: only the event loop's thread takes and gives them back."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._busy: set[str] = set()

    def take(self, namespace: str) -> None:
        if namespace in self._busy:
            raise StoreBusy(f"another store call of namespace {namespace} is in flight")
        if len(self._busy) >= self.total:
            raise StoreBusy("every store call slot is in use")
        self._busy.add(namespace)

    def give_back(self, namespace: str) -> None:
        self._busy.discard(namespace)

    def in_flight(self, namespace: str) -> bool:
        return namespace in self._busy


SLOTS = Slots(POOL_SIZE)
_POOL = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="store-call")
_CURRENT = threading.local()  # the deadline of the call running on this thread


@contextlib.contextmanager
def _within(deadline: Deadline) -> Iterator[None]:
    _CURRENT.deadline = deadline
    try:
        yield
    finally:
        _CURRENT.deadline = None


async def bounded(namespace: str, work: Callable[[], T], *, seconds: float | None = None) -> T:
    """Run blocking store work (boto3) on the store pool under the namespace's slot, within `seconds`
    (default: the call deadline). Raises StoreBusy, StoreTimeout or the work's StoreError."""
    budget = limits().call_seconds if seconds is None else seconds
    SLOTS.take(namespace)
    deadline = Deadline.after(budget, time.monotonic())

    def run() -> T:
        with _within(deadline):
            return work()

    future = asyncio.get_running_loop().run_in_executor(_POOL, run)
    # The slot is given back when the thread is done, not when this coroutine stops waiting.
    future.add_done_callback(lambda _: SLOTS.give_back(namespace))
    try:
        # The watchdog cuts the socket at the deadline; the margin only covers the thread's return.
        async with asyncio.timeout(budget + 5.0):
            return await asyncio.shield(future)
    except TimeoutError:
        raise StoreTimeout(f"no answer within {budget:.0f} s") from None


@contextlib.asynccontextmanager
async def slot(namespace: str) -> AsyncIterator[None]:
    """The namespace's slot around store work that is not a boto3 call (a listing in a pod)."""
    SLOTS.take(namespace)
    try:
        yield
    finally:
        SLOTS.give_back(namespace)


# --- the transport: botocore's requests over a socket with a deadline ---------------------------------------


class _Body:
    """A response body already read (bounded), shaped as botocore reads one."""

    def __init__(self, data: bytes) -> None:
        self._io = io.BytesIO(data)

    def stream(self, amt: int = 65536, decode_content: bool = False) -> Iterator[bytes]:
        while chunk := self._io.read(amt):
            yield chunk

    def read(self, amt: int | None = None) -> bytes:
        return self._io.read(amt) if amt is not None else self._io.read()

    def close(self) -> None:
        pass


def _cut(sock: socket.socket, cut: threading.Event) -> None:
    """Shut the socket (the plain socket's shutdown, also under TLS): a read blocked on it returns. What
    was read by then is not an answer, however it parses."""
    cut.set()
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _body_bytes(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if hasattr(body, "read"):
        with contextlib.suppress(AttributeError, OSError):
            body.seek(0)
        data = body.read()
        return data.encode() if isinstance(data, str) else bytes(data)
    return bytes(body)


def send(request: Any, **_: Any) -> Any:
    """botocore's before-send hook: send `request` and return its response, within the call's deadline."""
    from botocore.awsrequest import AWSResponse

    limits_now = limits()
    deadline: Deadline | None = getattr(_CURRENT, "deadline", None)
    if deadline is None:  # a client call outside bounded(): the call deadline from now
        deadline = Deadline.after(limits_now.call_seconds, time.monotonic())
    if deadline.expired(time.monotonic()):
        raise StoreTimeout("the call's deadline passed before this request")
    url = urlsplit(request.url)
    secure = url.scheme == "https"
    host = url.hostname or ""
    port = url.port or (443 if secure else 80)
    try:
        sock = socket.create_connection(
            (host, port), timeout=deadline.socket_timeout(time.monotonic(), limits_now.connect_seconds)
        )
    except OSError as exc:
        if deadline.expired(time.monotonic()):
            raise StoreTimeout(f"could not connect to {host}:{port} by the deadline") from None
        raise StoreError(f"could not connect to {host}:{port}: {exc}") from None
    cut = threading.Event()
    watchdog = threading.Timer(deadline.remaining(time.monotonic()), _cut, (sock, cut))
    watchdog.daemon = True
    watchdog.start()
    try:
        sock.settimeout(deadline.remaining(time.monotonic()) or 0.001)
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            watchdog.cancel()  # the TLS socket owns the descriptor now: watch that one
            watchdog = threading.Timer(deadline.remaining(time.monotonic()), _cut, (sock, cut))
            watchdog.daemon = True
            watchdog.start()
        conn = http.client.HTTPConnection(host, port)
        conn.sock = sock  # never connects on its own
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() != "expect"}
        conn.request(request.method, path, body=_body_bytes(request.body), headers=headers)
        response = conn.getresponse()
        data = response.read(limits_now.max_response_bytes + 1)
        if cut.is_set() or deadline.expired(time.monotonic()):
            raise StoreTimeout(f"{host}:{port} did not answer within the call's deadline")
        if len(data) > limits_now.max_response_bytes:
            raise StoreError(f"the store's answer exceeds {limits_now.max_response_bytes} bytes")
        return AWSResponse(request.url, response.status, response.getheaders(), _Body(data))
    except (OSError, http.client.HTTPException) as exc:
        if cut.is_set() or deadline.expired(time.monotonic()):
            raise StoreTimeout(f"{host}:{port} did not answer within the call's deadline") from None
        raise StoreError(f"{type(exc).__name__}: {exc}") from None
    finally:
        watchdog.cancel()
        with contextlib.suppress(OSError):
            sock.close()


def attach(client: Any) -> Any:
    """Send every request of a boto3 S3 client through `send`."""
    client.meta.events.register_first("before-send.s3", send)
    return client
