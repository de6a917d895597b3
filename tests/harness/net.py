"""Loopback ports and HTTP(S) reads (health, metrics and Patroni endpoints of local processes)."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free at the moment of asking."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def http_get(url: str, timeout: float = 2, cafile: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is an answer too, a refused connection raises. An
    https URL is verified against `cafile`."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310 (local URLs)
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
