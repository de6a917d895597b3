"""Commands in a pod's container through the API server's exec subresource, over a WebSocket.

The channel protocol (v5.channel.k8s.io, or v4 from older servers): every binary message starts with a
channel byte — 0 stdin, 1 stdout, 2 stderr, 3 the final status as JSON (`{"status": "Success"}`, or a Failure
whose causes carry `ExitCode`). Authentication is the controller's own (kubeconfig or the in-cluster
service account, as `kube.load_config` finds it): the same CA, client certificate or bearer token. The
command line is never logged (callers build it from names only; secrets stay in the pod's environment).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from lightkube import KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig

from pg_operator.api.constants import SUPERUSER
from pg_operator.controller.metrics import Metrics
from pg_operator.privileged_sql import PINNED_OPTIONS

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
# psql in the instance's container, as the superuser over the Unix socket (peer authentication), its
# search path, role and read-only default pinned for every connection it opens (privileged_sql.py).
SOCKET_DIR = "/var/run/postgresql"
PSQL_ARGV = ["psql", "-h", SOCKET_DIR, "-U", SUPERUSER, "-d", "postgres", "-AtX", "-v", "ON_ERROR_STOP=1"]
PSQL = ["env", f"PGOPTIONS={PINNED_OPTIONS}", *PSQL_ARGV]
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
CLOSE = 255  # v5: a message [255, channel] closes that stream (stdin's end of file)
STDIN_CHUNK = 32 * 1024
MAX_CAPTURE = 1 << 20


class ExecError(Exception):
    """The command could not be run at all (pod gone, container not running, refused)."""


@dataclass(frozen=True)
class ExecResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return f"{self.stdout}\n{self.stderr}".strip()


def exit_status_of(status: dict[str, Any]) -> int:
    """The exit code from channel 3's Status object."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or ():
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message") or 1)
    raise ExecError(str(status.get("message") or status.get("reason") or "exec failed"))


def exec_url(
    server: str, namespace: str, pod: str, container: str, argv: list[str], *, stdin: bool = False
) -> str:
    streams = [("container", container), ("stdout", "true"), ("stderr", "true")]
    if stdin:
        streams.append(("stdin", "true"))
    query = urlencode(streams + [("command", a) for a in argv])
    base = server.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?{query}"


@dataclass(frozen=True)
class PipeResult:
    """What `PodExec.pipe` saw: the source's exit and stderr, each sink's result, the bytes relayed."""

    source: ExecResult
    sinks: dict[str, ExecResult | ExecError]
    bytes: int


@dataclass
class _Sinks:
    """The sinks of one pipe: those still fed, every socket opened (closed at the end), what each said."""

    namespace: str
    open: dict[str, aiohttp.ClientWebSocketResponse] = field(default_factory=dict)
    opened: list[aiohttp.ClientWebSocketResponse] = field(default_factory=list)
    results: dict[str, ExecResult | ExecError] = field(default_factory=dict)
    readers: dict[str, asyncio.Task[ExecResult]] = field(default_factory=dict)
    sent: int = 0

    async def feed(self, payload: bytes) -> None:
        """The source's stdout into every sink still open; one that broke is dropped with its error."""
        self.sent += len(payload)
        for pod in list(self.open):
            if self.readers[pod].done():
                self.open.pop(pod)  # it ended early; what it said is its result
                continue
            try:
                await self.open[pod].send_bytes(bytes([STDIN]) + payload)
            except (aiohttp.ClientError, OSError, ConnectionError) as exc:
                self.results[pod] = ExecError(f"exec in {self.namespace}/{pod}: stdin broke: {exc}")
                self.open.pop(pod)

    async def finish(self) -> None:
        """Close each sink's stdin and collect what it said."""
        for ws in self.open.values():
            with contextlib.suppress(aiohttp.ClientError, OSError, ConnectionError):
                await ws.send_bytes(bytes([CLOSE, STDIN]))
        for pod, task in self.readers.items():
            if pod in self.results:
                task.cancel()
                continue
            try:
                self.results[pod] = await task
            except ExecError as exc:
                self.results[pod] = exc

    async def close(self) -> None:
        for task in self.readers.values():
            task.cancel()
        for ws in self.opened:
            await ws.close()


async def _relay(
    src: aiohttp.ClientWebSocketResponse, fed: _Sinks
) -> tuple[dict[str, Any] | None, bytearray]:
    """Stream the source's stdout into the sinks until it ends: its exit status and its stderr."""
    err = bytearray()
    status: dict[str, Any] | None = None
    async for msg in src:
        channel, payload = _frame(msg)
        if channel is None:
            break
        if channel == STDOUT and payload:
            await fed.feed(payload)
        elif channel == STDERR and len(err) < MAX_CAPTURE:
            err += payload
        elif channel == STATUS and payload:
            status = json.loads(payload)
    return status, err


def _frame(msg: aiohttp.WSMessage) -> tuple[int | None, bytes]:
    """A message's channel and payload; (None, b"") once the stream ended."""
    if msg.type == aiohttp.WSMsgType.BINARY:
        data: bytes = msg.data
    elif msg.type == aiohttp.WSMsgType.TEXT:
        data = msg.data.encode()
    else:
        return None, b""
    return (data[0], data[1:]) if data else (-1, b"")


async def _collect(ws: aiohttp.ClientWebSocketResponse, where: str) -> ExecResult:
    """A command's output and exit status, read until its stream ends."""
    out, err = bytearray(), bytearray()
    status: dict[str, Any] | None = None
    async for msg in ws:
        channel, payload = _frame(msg)
        if channel is None:
            break
        if channel == STDOUT and len(out) < MAX_CAPTURE:
            out += payload
        elif channel == STDERR and len(err) < MAX_CAPTURE:
            err += payload
        elif channel == STATUS and payload:
            status = json.loads(payload)
    if status is None:
        raise ExecError(f"exec in {where} ended without an exit status")
    return ExecResult(exit_status_of(status), out.decode(errors="replace"), err.decode(errors="replace"))


class PodExec:
    def __init__(self, config: KubeConfig, metrics: Metrics | None = None) -> None:
        single = config.get()
        if single is None:
            raise ExecError("the kubeconfig names no current context")
        self._config: SingleConfig = single
        self._metrics = metrics
        self._ssl: ssl.SSLContext | None = None
        if self._config.cluster.server.startswith("https"):
            user = self._config.user
            if user is None:
                from lightkube.config.models import User

                user = User()
            self._ssl = verify_cluster(self._config.cluster, user, self._config.abs_file)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        user = self._config.user
        if user is None:
            return {}
        token = user.token
        if user.token_file:  # a projected service account token is rotated on disk
            token = Path(user.token_file).read_text().strip()
        return {"Authorization": f"Bearer {token.strip()}"} if token else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(
        self,
        namespace: str,
        pod: str,
        argv: list[str],
        *,
        container: str = "postgres",
        seconds: float = 60,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run argv in the container. `stdin` (for what must not be in argv, say a password verifier) is
        sent and then closed, which only v5 of the protocol can express."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if self._metrics is not None:
            self._metrics.api_requests.labels(verb="exec").inc()
        url = exec_url(self._config.cluster.server, namespace, pod, container, argv, stdin=stdin is not None)
        try:
            async with asyncio.timeout(seconds):
                async with self._session.ws_connect(
                    url, protocols=PROTOCOLS, headers=self._headers(), ssl=self._ssl or True, max_msg_size=0
                ) as ws:
                    if stdin is not None:
                        if ws.protocol != PROTOCOLS[0]:
                            raise ExecError(
                                f"exec in {namespace}/{pod}: the server cannot close stdin "
                                f"({ws.protocol} instead of {PROTOCOLS[0]})"
                            )
                        for at in range(0, len(stdin), STDIN_CHUNK):
                            await ws.send_bytes(bytes([STDIN]) + stdin[at : at + STDIN_CHUNK])
                        await ws.send_bytes(bytes([CLOSE, STDIN]))
                    return await _collect(ws, f"{namespace}/{pod}")
        except aiohttp.WSServerHandshakeError as exc:
            raise ExecError(f"exec in {namespace}/{pod} refused: HTTP {exc.status} {exc.message}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ExecError(f"exec in {namespace}/{pod} failed: {type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise ExecError(f"exec in {namespace}/{pod} took longer than {seconds:.0f} s") from None

    async def pipe(
        self,
        namespace: str,
        source: tuple[str, list[str]],
        sinks: Sequence[tuple[str, list[str]]],
        *,
        container: str = "postgres",
        seconds: float = 600,
    ) -> PipeResult:
        """Run source's argv in its pod and every sink's in theirs, the source's stdout streamed into each
        sink's stdin as it arrives (one message held at a time, so the size of what flows does not matter),
        each sink's stdin closed once the source ended. A sink that fails to start or dies mid-stream is
        reported in `sinks` as an ExecError and the others go on; the source failing to start raises."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        server = self._config.cluster.server
        fed = _Sinks(namespace)
        try:
            async with asyncio.timeout(seconds):
                for pod, argv in sinks:
                    await self._open_sink(
                        fed, pod, exec_url(server, namespace, pod, container, argv, stdin=True)
                    )
                src = await self._connect(exec_url(server, namespace, source[0], container, source[1]))
                async with src:
                    status, err = await _relay(src, fed)
                await fed.finish()
        except TimeoutError:
            why = f"streaming from {namespace}/{source[0]} took longer than {seconds:.0f} s"
            raise ExecError(why) from None
        finally:
            await fed.close()
        if status is None:
            raise ExecError(f"exec in {namespace}/{source[0]} ended without an exit status")
        src_result = ExecResult(exit_status_of(status), "", err.decode(errors="replace"))
        return PipeResult(src_result, fed.results, fed.sent)

    async def _open_sink(self, fed: _Sinks, pod: str, url: str) -> None:
        """Connect a sink (its failure to start is its result) and start reading what it says."""
        try:
            ws = await self._connect(url)
        except ExecError as exc:
            fed.results[pod] = exc
            return
        if ws.protocol != PROTOCOLS[0]:
            await ws.close()
            fed.results[pod] = ExecError(f"exec in {fed.namespace}/{pod}: the server cannot close stdin")
            return
        fed.opened.append(ws)
        fed.open[pod] = ws
        fed.readers[pod] = asyncio.create_task(_collect(ws, f"{fed.namespace}/{pod}"))

    async def _connect(self, url: str) -> aiohttp.ClientWebSocketResponse:
        assert self._session is not None
        if self._metrics is not None:
            self._metrics.api_requests.labels(verb="exec").inc()
        try:
            return await self._session.ws_connect(
                url, protocols=PROTOCOLS, headers=self._headers(), ssl=self._ssl or True, max_msg_size=0
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise ExecError(f"exec refused: HTTP {exc.status} {exc.message}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ExecError(f"exec failed: {type(exc).__name__}: {exc}") from None

    async def sh(self, namespace: str, pod: str, script: str, *, seconds: float = 60) -> ExecResult:
        return await self.run(namespace, pod, ["sh", "-c", script], seconds=seconds)
