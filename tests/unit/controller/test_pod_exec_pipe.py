"""PodExec.pipe against a stand-in for the exec endpoint (an aiohttp WebSocket server speaking the
v5.channel.k8s.io framing, no cluster): the source's stdout reaches every sink's stdin whole, each sink's
stdin is closed once the source ends, and a sink that cannot start is reported while the others go on."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

from aiohttp import WSMsgType, web
from lightkube import KubeConfig

from pg_operator.controller.pod_exec import CLOSE, STATUS, STDIN, STDOUT, ExecError, ExecResult, PodExec

SUCCESS = json.dumps({"status": "Success"}).encode()
CHUNKS = [b"a" * 70_000, b"b" * 5, b"c" * 1000]


async def exec_endpoint(request: web.Request) -> web.StreamResponse:
    pod = request.match_info["pod"]
    if pod == "gone":
        raise web.HTTPNotFound()
    ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
    await ws.prepare(request)
    if "stdin" not in parse_qs(request.query_string):  # the source: write, then exit 0
        for chunk in CHUNKS:
            await ws.send_bytes(bytes([STDOUT]) + chunk)
        await ws.send_bytes(bytes([STATUS]) + SUCCESS)
        await ws.close()
        return ws
    received = bytearray()
    async for msg in ws:  # a sink: read stdin to its end, say how much came and exit 0
        assert msg.type == WSMsgType.BINARY
        if msg.data == bytes([CLOSE, STDIN]):
            break
        assert msg.data[0] == STDIN
        received += msg.data[1:]
    await ws.send_bytes(bytes([STDOUT]) + f"{len(received)} {received[:1].decode()}".encode())
    await ws.send_bytes(bytes([STATUS]) + SUCCESS)
    await ws.close()
    return ws


async def piped() -> tuple[object, ...]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", exec_endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    exec_ = PodExec(KubeConfig.from_server(f"http://127.0.0.1:{port}"))
    try:
        result = await exec_.pipe("shop", ("src", ["cat"]), [("one", ["sink"]), ("gone", ["sink"]),
                                                              ("two", ["sink"])], seconds=30)  # fmt: skip
    finally:
        await exec_.close()
        await runner.cleanup()
    return (result,)


def test_the_source_reaches_every_sink_and_a_broken_sink_is_reported() -> None:
    (result,) = asyncio.run(piped())
    total = sum(len(c) for c in CHUNKS)
    assert result.source == ExecResult(0, "", "")  # type: ignore[attr-defined]
    assert result.bytes == total  # type: ignore[attr-defined]
    sinks = result.sinks  # type: ignore[attr-defined]
    assert sinks["one"] == ExecResult(0, f"{total} a", "")
    assert sinks["two"] == ExecResult(0, f"{total} a", "")
    assert isinstance(sinks["gone"], ExecError) and "404" in str(sinks["gone"])
