"""The pooler pod's metrics server speaks only TLS, with the mounted server certificate, and takes up a
renewed one (a new `..data` version) for the next connection: a real server on loopback, real
certificates from the operator's own builders, no PgBouncer (the scrape reports it down)."""

from __future__ import annotations

import datetime as dt
import http.client
import socket
import ssl
from pathlib import Path

import pytest

from harness.objects import cluster_model
from pg_operator.pooler.config import Settings
from pg_operator.pooler.main import serve_metrics
from pg_operator.specs.tls import issue_server, new_ca

NOW = dt.datetime.now(dt.UTC)


def mount(tls: Path, version: str, cert: bytes, key: bytes) -> None:
    """A Secret volume as the kubelet lays it out: files in a version directory behind `..data`."""
    (tls / version).mkdir()
    (tls / version / "tls.crt").write_bytes(cert)
    (tls / version / "tls.key").write_bytes(key)
    link = tls / "..data"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(version)
    for name in ("tls.crt", "tls.key"):
        if not (tls / name).is_symlink():
            (tls / name).symlink_to(f"..data/{name}")


def fetch(port: int, ca: bytes) -> tuple[bytes, bytes]:
    """(the served certificate, the body) over verified TLS."""
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="orders-db-pooler-rw") as tls:  # fmt: skip
        served = tls.getpeercert(binary_form=True) or b""
        tls.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    return served, data.partition(b"\r\n\r\n")[2]


def test_metrics_over_tls_only_and_a_renewed_certificate_is_served_next(tmp_path: Path) -> None:
    cluster = cluster_model()
    ca = new_ca(cluster, NOW)
    first, second = issue_server(cluster, ca, NOW), issue_server(cluster, ca, NOW)
    tls, run = tmp_path / "tls", tmp_path / "run"
    tls.mkdir()
    run.mkdir()
    mount(tls, "..v1", first.cert_pem, first.key_pem)
    s = Settings(cluster="orders-db", side="rw", mode="transaction", target="orders-db-0",
                 tls_dir=str(tls), run_dir=str(run))  # fmt: skip
    server = serve_metrics(s, port=0)
    port = server.server_address[1]
    try:
        served, body = fetch(port, ca.cert_pem)
        assert served == ssl.PEM_cert_to_DER_cert(first.cert_pem.decode())
        assert b"pgbouncer_up 0" in body  # no PgBouncer here: reported down, not an error
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((OSError, http.client.HTTPException)):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        conn.close()
        mount(tls, "..v2", second.cert_pem, second.key_pem)
        served, _ = fetch(port, ca.cert_pem)
        assert served == ssl.PEM_cert_to_DER_cert(second.cert_pem.decode())
    finally:
        server.shutdown()
        server.server_close()
