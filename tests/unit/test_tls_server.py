"""The bounded HTTPS server's pure parts (the request line, the response), and its refusals on a real
loopback socket with small limits and plain HTTP (the TLS side is covered with the instance's and the
pooler's servers in tests/integration/test_instance_endpoints.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from pg_operator.tls_server import (
    BoundedHttpsServer,
    RequestRefused,
    Response,
    ServerLimits,
    parse_request_line,
    render_response,
)


def test_the_request_line_gives_method_and_path() -> None:
    assert parse_request_line(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == ("GET", "/metrics?x=1")


@pytest.mark.parametrize(
    "head",
    [
        b"GET /metrics\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2\r\n\r\n",
        b"\x16\x03\x01\x02\x00\r\n\r\n",
    ],
)
def test_anything_else_is_a_bad_request(head: bytes) -> None:
    with pytest.raises(RequestRefused) as refused:
        parse_request_line(head)
    assert refused.value.status == 400


def test_a_response_says_its_length_and_closes() -> None:
    text = render_response(Response(200, "text/plain", b"pg_up 1\n"))
    assert text == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n"
        b"Connection: close\r\n\r\npg_up 1\n"
    )
    assert render_response(Response(200, "text/plain", b"pg_up 1\n"), with_body=False).endswith(b"\r\n\r\n")


LIMITS = ServerLimits(
    max_connections=4, max_connections_per_peer=2, request_deadline=5.0, max_request_bytes=256
)


@pytest.fixture
def server() -> Iterator[BoundedHttpsServer]:
    s = BoundedHttpsServer(
        ("127.0.0.1", 0), lambda path: Response(200, "text/plain", path.encode()), lambda: None, LIMITS
    )
    s.start("test-server")
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()


def ask(server: BoundedHttpsServer, request: bytes) -> bytes:
    with socket.create_connection(server.server_address, timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return data


def test_a_request_is_answered_once_and_closed(server: BoundedHttpsServer) -> None:
    assert ask(server, b"GET /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n/metrics")


def test_an_oversized_request_is_refused(server: BoundedHttpsServer) -> None:
    answer = ask(server, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 1000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]


def test_only_get_and_head(server: BoundedHttpsServer) -> None:
    assert ask(server, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert ask(server, b"HEAD /metrics HTTP/1.1\r\n\r\n").endswith(b"Connection: close\r\n\r\n")


def test_a_peer_over_its_cap_pushes_out_its_own_oldest_waiting_connection(server: BoundedHttpsServer) -> None:
    first, second = (socket.create_connection(server.server_address, timeout=10) for _ in range(2))
    try:
        answer = ask(server, b"GET /metrics HTTP/1.1\r\n\r\n")  # the third from this peer: still answered
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert first.recv(16) == b""  # the oldest idle one was closed to make room
        assert server.pushed_out >= 1
    finally:
        first.close()
        second.close()
