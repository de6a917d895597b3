"""A small HTTPS server for the endpoints the instance and pooler pods serve (their /metrics), bounded
against hostile peers: a peer that opens many connections and sends nothing, or sends its request one
byte at a time, costs at most a socket until a deadline, never a thread, and never shuts out a scraper.

- One event-loop thread holds every connection; answers are produced by one worker thread (a scrape
  reads the database or PgBouncer's console and must not run many at once).
- At most `max_connections` open at once and `max_connections_per_peer` from one address: a new
  connection over either cap closes the oldest one of that peer (or of all) still waiting for its
  request, so whoever floods only pushes out its own; a connection being answered is never pushed out.
- Each connection gets `request_deadline` from acceptance to the end of its request's headers, the TLS
  handshake included (`handshake_timeout` alone), a request of at most `max_request_bytes`, and
  `write_timeout` to take its answer. One request per connection (`Connection: close`).

A leaf: the standard library only (the pooler's supervisor imports nothing heavier; the instance image
ships this file).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 32
    max_connections_per_peer: int = 8
    handshake_timeout: float = 5.0
    request_deadline: float = 10.0  # from acceptance to the end of the request's headers
    max_request_bytes: int = 8192
    write_timeout: float = 10.0
    listen_backlog: int = 128


DEFAULT_LIMITS = ServerLimits()


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


# The request's path (its query left on) → the answer; runs on the worker thread.
Answer = Callable[[str], Response]
# The TLS context for the next connection (re-read by the caller when its certificate is renewed), or
# None for plain HTTP.
TlsContext = Callable[[], ssl.SSLContext | None]


class RequestRefused(Exception):
    def __init__(self, status: HTTPStatus) -> None:
        super().__init__(status.phrase)
        self.status = status


@dataclass
class _Connection:
    peer: str
    writer: asyncio.StreamWriter
    task: asyncio.Task[Any] | None
    answering: bool = False  # its request is in: no longer pushed out by newcomers
    pushed_out: bool = False


@dataclass
class _Open:
    """The connections open now, oldest first (dicts keep insertion order)."""

    by_id: dict[int, _Connection] = field(default_factory=dict)

    def per_peer(self, peer: str) -> int:
        return sum(1 for c in self.by_id.values() if c.peer == peer)

    def oldest_waiting(self, peer: str | None = None) -> _Connection | None:
        return next((c for c in self.by_id.values() if not c.answering and peer in (None, c.peer)), None)


def parse_request_line(head: bytes) -> tuple[str, str]:
    """(method, path) of a request's headers; RequestRefused(400) for anything but `METHOD PATH HTTP/1.x`."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        raise RequestRefused(HTTPStatus.BAD_REQUEST)
    try:
        return parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise RequestRefused(HTTPStatus.BAD_REQUEST) from None


def render_response(response: Response, *, with_body: bool = True) -> bytes:
    status = HTTPStatus(response.status)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (response.body if with_body else b"")


def refusal(status: HTTPStatus) -> Response:
    return Response(status.value, "text/plain; charset=utf-8", f"{status.phrase}\n".encode())


class BoundedHttpsServer:
    """Serves `answer` on `address` from a daemon thread once started; `shutdown()` and `server_close()`
    stop it (the names http.server's servers use)."""

    def __init__(self, address: tuple[str, int], answer: Answer, tls: TlsContext,
                 limits: ServerLimits = DEFAULT_LIMITS) -> None:  # fmt: skip
        self.answer, self.tls, self.limits = answer, tls, limits
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=limits.listen_backlog)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._open = _Open()
        self._loop = asyncio.new_event_loop()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="answer")
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.pushed_out = 0  # connections closed to make room (for the owner's own figures)

    def start(self, name: str) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve(ready))

    async def _serve(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        limit = self.limits.max_request_bytes
        server = await asyncio.start_server(self._client, sock=self.socket, limit=limit)
        ready.set()
        async with server:
            await self._stopped.wait()
            for conn in list(self._open.by_id.values()):
                self._push_out(conn)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def shutdown(self) -> None:
        if self._stopped is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)

    def server_close(self) -> None:
        self._worker.shutdown(wait=False)
        self.socket.close()
        if self._thread is None or not self._thread.is_alive():
            self._loop.close()

    # --- one connection ---------------------------------------------------------------------------------

    def _admit(self, conn: _Connection) -> bool:
        """Make room for a new connection by pushing out the oldest still waiting for its request, of this
        peer first; False when every open one is being answered (the newcomer is closed instead)."""
        limits = self.limits
        if self._open.per_peer(conn.peer) >= limits.max_connections_per_peer:
            victim = self._open.oldest_waiting(conn.peer)
            if victim is None:
                return False
            self._push_out(victim)
        if len(self._open.by_id) >= limits.max_connections:
            victim = self._open.oldest_waiting()
            if victim is None:
                return False
            self._push_out(victim)
        self._open.by_id[id(conn)] = conn
        return True

    def _push_out(self, victim: _Connection) -> None:
        victim.pushed_out = True
        self._open.by_id.pop(id(victim), None)
        self.pushed_out += 1
        victim.writer.transport.abort()
        if victim.task is not None:
            victim.task.cancel()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = _Connection(str(peer[0]) if peer else "", writer, asyncio.current_task())
        if not self._admit(conn):
            writer.transport.abort()
            return
        try:
            await self._converse(conn, reader, writer)
        except asyncio.CancelledError:
            if not conn.pushed_out:
                raise
        except (OSError, ssl.SSLError, TimeoutError, EOFError, asyncio.IncompleteReadError):
            pass  # the peer went away, failed its handshake or was too slow: nothing to answer
        finally:
            self._open.by_id.pop(id(conn), None)
            writer.transport.abort()

    async def _converse(self, conn: _Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:  # fmt: skip
        limits = self.limits
        try:
            async with asyncio.timeout(limits.request_deadline):
                context = self.tls()
                if context is not None:
                    await writer.start_tls(context, ssl_handshake_timeout=limits.handshake_timeout)
                method, path = await self._read_request(reader)
        except RequestRefused as refused:
            await self._send(writer, refusal(refused.status))
            return
        if method not in ("GET", "HEAD"):
            await self._send(writer, refusal(HTTPStatus.METHOD_NOT_ALLOWED))
            return
        conn.answering = True
        response = await asyncio.get_running_loop().run_in_executor(self._worker, self.answer, path)
        await self._send(writer, response, with_body=method == "GET", answered=conn)

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise RequestRefused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
        except ValueError:  # the separator is past the limit: the stream says so this way too
            raise RequestRefused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
        return parse_request_line(head)

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *, with_body: bool = True,
                    answered: _Connection | None = None) -> None:  # fmt: skip
        writer.write(render_response(response, with_body=with_body))
        async with asyncio.timeout(self.limits.write_timeout):
            await writer.drain()
            if answered is not None:
                answered.answering = False  # all written: a peer that lingers now may be pushed out
            with contextlib.suppress(OSError, ssl.SSLError):
                writer.close()  # TLS: a close_notify, so the peer knows the body is whole
                await writer.wait_closed()
