"""The HTTPS servers an instance and a pooler pod run (the instance's /metrics on 9187, the pooler's on
9127) withstand hostile peers: many connections that send nothing, and a peer that sends its request one
byte at a time. Each server runs in this process as its pod runs it, on loopback with a certificate from
the operator's own builders; the instance's reads a real PostgreSQL (tests/harness/local_postgres.py),
the pooler's runs without PgBouncer (its scrape reports it down). No Kubernetes is needed.

What is shown: a well-behaved scrape is still answered while hundreds of idle connections are open, the
server's threads stay few (a thread per connection is what the attack exhausts), every idle connection
is closed by the server, and a slow request is cut off before it ever completes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import select
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from harness.local_postgres import Postgres, postgresql_16, run_user
from harness.net import free_port
from harness.objects import cluster_model
from harness.waiting import wait_until
from pg_operator.instance import metrics_server
from pg_operator.pooler.config import Settings
from pg_operator.pooler.main import serve_metrics
from pg_operator.specs.tls import KeyPair, issue_server, new_ca

SERVER_NAME = "orders-db-pooler-rw"  # one of the names the server certificate carries
IDLE_CONNECTIONS = 500  # well above any cap a server should have
# Threads the server may add while attacked: its own few, never one per connection.
MAX_EXTRA_THREADS = 8
# How long the test waits for the server to act (generous: the machine is shared); not a timing goal.
PATIENCE_SECONDS = 90.0
SLOW_BYTE_INTERVAL = 0.5


class Server(Protocol):
    server_address: tuple[str, int]

    def shutdown(self) -> None: ...
    def server_close(self) -> None: ...


@dataclass(frozen=True)
class Endpoint:
    port: int
    ca_pem: bytes
    healthy_line: bytes  # what a good scrape's body holds


@pytest.fixture(scope="module")
def pki() -> tuple[KeyPair, KeyPair]:
    cluster = cluster_model()
    now = dt.datetime.now(dt.UTC)
    ca = new_ca(cluster, now)
    return ca, issue_server(cluster, ca, now)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    # Not under pytest's temporary directory: PostgreSQL's user must reach its data directory.
    work = Path(tempfile.mkdtemp(prefix="pgop-endpoints-it-", dir="/var/tmp"))
    work.chmod(0o755)
    pg_home = postgresql_16()
    env = {"PATH": f"{pg_home / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(pg_home / "lib"),
           "LANG": "C.UTF-8", "HOME": "/nonexistent"}  # fmt: skip
    pg = Postgres("metrics", work / "metrics" / "pgdata", free_port(), pg_home, run_user(), env)
    pg.initdb()
    pg.configure(pg.base_parameters())
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def running(server: Server) -> Iterator[int]:
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["instance", "pooler"])
def endpoint(request: pytest.FixtureRequest, pki: tuple[KeyPair, KeyPair],
             tmp_path: Path) -> Iterator[Endpoint]:  # fmt: skip
    ca, served = pki
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "tls.crt").write_bytes(served.cert_pem)
    (tls / "tls.key").write_bytes(served.key_pem)
    if request.param == "instance":
        pg: Postgres = request.getfixturevalue("postgres")
        server: Server = metrics_server.start(
            socket_dir=str(pg.socket_dir), pg_port=pg.port, login_user="postgres", listen_host="127.0.0.1",
            port=0, cert=str(tls / "tls.crt"), key=str(tls / "tls.key"),
        )  # fmt: skip
        healthy = b"pg_up 1"
    else:
        run = tmp_path / "run"
        run.mkdir()
        settings = Settings(cluster="orders-db", side="rw", mode="transaction", target="orders-db-0",
                            tls_dir=str(tls), run_dir=str(run))  # fmt: skip
        server = serve_metrics(settings, port=0)
        healthy = b"pgbouncer_up 0"  # no PgBouncer here: reported down, and still answered
    with running(server) as port:
        yield Endpoint(port, ca.cert_pem, healthy)


def scrape(ep: Endpoint) -> bytes:
    """GET /metrics as Prometheus does, verifying the certificate; the response's body."""
    context = ssl.create_default_context(cadata=ep.ca_pem.decode())
    with socket.create_connection(("127.0.0.1", ep.port), timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:  # fmt: skip
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: scraper\r\nAccept: text/plain\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], head[:200]
    return body


def open_idle(port: int, count: int) -> list[socket.socket]:
    """TCP connections that never send a byte (not even a TLS hello); those the server refuses at once
    count too, as refused."""
    out = []
    for _ in range(count):
        with contextlib.suppress(OSError):  # refused or dropped at the door: what a cap may do
            out.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return out


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed this connection (EOF or reset), without blocking."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""  # a TLS alert or a 408 would be data: read on next time
    except (ConnectionResetError, ssl.SSLError, OSError):
        return True


def server_spoke(tls: ssl.SSLSocket, wait: float) -> bytes | None:
    """What the server sent on this connection within `wait` seconds: None for nothing (a TLS session
    ticket is not something said), b"" for a close or a reset, else the bytes."""
    readable, _, _ = select.select([tls], [], [], wait)
    if not readable:
        return None
    tls.setblocking(False)
    try:
        return tls.recv(4096)
    except ssl.SSLWantReadError:
        return None
    except OSError:
        return b""
    finally:
        tls.settimeout(10)


def test_idle_connections_cost_no_thread_each_and_are_closed(endpoint: Endpoint) -> None:
    scrape(endpoint)  # the server's own threads (and the instance's database session) exist now
    baseline = threading.active_count()
    idle = open_idle(endpoint.port, IDLE_CONNECTIONS)
    try:
        assert idle, "not one connection was accepted"
        body = scrape(endpoint)
        assert endpoint.healthy_line in body, body[:500]
        extra = threading.active_count() - baseline
        assert extra <= MAX_EXTRA_THREADS, f"{extra} more threads with {len(idle)} idle connections open"
        pending = list(idle)

        def all_closed() -> bool:
            pending[:] = [s for s in pending if not closed_by_server(s)]
            return not pending

        wait_until(f"the server to close {len(idle)} idle connections", all_closed, PATIENCE_SECONDS, 0.5)
        assert endpoint.healthy_line in scrape(endpoint)
    finally:
        for s in idle:
            s.close()


def test_a_request_sent_one_byte_at_a_time_is_cut_off(endpoint: Endpoint) -> None:
    context = ssl.create_default_context(cadata=endpoint.ca_pem.decode())
    raw = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
    with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
        # A request whose headers never end: one byte at a time, slowly, for as long as the server lets.
        endless = b"GET /metrics HTTP/1.1\r\nHost: scraper\r\n" + b"X-Slow: " + b"a" * 100_000
        sent, cut_off = 0, False
        give_up = time.monotonic() + PATIENCE_SECONDS
        while time.monotonic() < give_up and sent < len(endless):
            try:
                tls.sendall(endless[sent : sent + 1])
            except OSError:
                cut_off = True
                break
            sent += 1
            answer = server_spoke(tls, SLOW_BYTE_INTERVAL)
            if answer is not None:  # before the request was complete: EOF, a reset, or a refusal
                # It may say why (408, 431) before closing; it must never answer the request.
                assert b" 200 " not in answer.split(b"\r\n")[0], answer[:200]
                cut_off = True
                break
        assert cut_off, f"the server still waited for the rest of the request after {sent} bytes"
    assert endpoint.healthy_line in scrape(endpoint)
