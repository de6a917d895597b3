"""A small async client for the Patroni REST API of one cluster's instances.

The operator reads the members' view (GET /cluster: roles, state, timeline, lag), asks for planned
switchovers (POST /switchover), keeps the dynamic configuration (PATCH /config) and restarts members
that wait for a restart (POST /restart). Unsafe endpoints are protected by basic auth when the cluster's
instances were configured with REST API credentials; those are passed in, never logged. Only HTTPS: the
client verifies the certificate against the cluster's CA and the member's DNS name while it connects to the
pod's IP (no DNS lookup on the operator's side). There is no plain-HTTP endpoint to ask: a member whose
certificate cannot be verified is not asked at all, so basic auth never travels in clear.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pg_operator.api.constants import PATRONI_PORT

TIMEOUT = aiohttp.ClientTimeout(total=5, connect=2)


class PatroniError(RuntimeError):
    """Patroni refused or could not be reached; the message is Patroni's own, without credentials."""


@dataclass(frozen=True)
class PatroniAuth:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Endpoint:
    """One member's REST API over HTTPS: the pod's IP, the context that trusts the cluster's CA, and the
    name the member's certificate carries (checked instead of the IP)."""

    address: str
    tls: ssl.SSLContext
    server_name: str
    port: int = PATRONI_PORT

    def __post_init__(self) -> None:
        if not isinstance(self.tls, ssl.SSLContext) or self.tls.verify_mode != ssl.CERT_REQUIRED\
                or not self.tls.check_hostname or not self.server_name:  # fmt: skip
            raise ValueError("Patroni is asked over verified HTTPS only: a CA context and the member's name")

    def url(self, path: str) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}{path}"

    def options(self) -> dict[str, Any]:
        return {"ssl": self.tls, "server_hostname": self.server_name}

    def __str__(self) -> str:
        return self.address


class TrustStore:
    """SSL contexts that trust one CA each, made once per CA certificate (a handshake then costs no
    parsing). Bounded: a CA that is gone stops being asked for and is dropped when the store is full."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._contexts: dict[str, ssl.SSLContext] = {}

    def context(self, ca_pem: bytes) -> ssl.SSLContext:
        if not ca_pem.strip():
            raise ValueError("no CA certificate to trust")  # not the system's trust store instead
        key = hashlib.sha256(ca_pem).hexdigest()
        found = self._contexts.get(key)
        if found is None:
            found = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
            found.minimum_version = ssl.TLSVersion.TLSv1_2
            if len(self._contexts) >= self.LIMIT:
                self._contexts.clear()
            self._contexts[key] = found
        return found


async def get_cluster(session: aiohttp.ClientSession, member: Endpoint) -> Mapping[str, Any]:
    """GET /cluster from any member: every member answers with the whole cluster's view."""
    pod_ip = str(member)
    try:
        async with session.get(member.url("/cluster"), timeout=TIMEOUT, **member.options()) as resp:
            if resp.status != 200:
                raise PatroniError(f"GET /cluster on {pod_ip}: HTTP {resp.status}")
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PatroniError(f"GET /cluster on {pod_ip}: {type(e).__name__}: {e}") from None
    if not isinstance(body, dict):
        raise PatroniError(f"GET /cluster on {pod_ip}: unexpected body")
    return body


def _auth_headers(auth: PatroniAuth | None) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(auth.username, auth.password)} if auth else {}


async def _post(
    session: aiohttp.ClientSession,
    member: Endpoint,
    path: str,
    body: Mapping[str, Any],
    auth: PatroniAuth | None,
    limit_s: float,
    what: str,
) -> str:
    """POST a JSON body to an unsafe endpoint; Patroni's answer, or PatroniError naming `what`."""
    limit = aiohttp.ClientTimeout(total=limit_s, connect=2)
    try:
        async with session.post(
            member.url(path), json=dict(body), headers=_auth_headers(auth), timeout=limit, **member.options()
        ) as resp:
            text = (await resp.text()).strip()
            if resp.status != 200:
                raise PatroniError(f"{what} refused: HTTP {resp.status}: {text}")
            return text
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PatroniError(f"{what}: {type(e).__name__}: {e}") from None


async def switchover(
    session: aiohttp.ClientSession,
    member: Endpoint,
    leader: str,
    candidate: str,
    auth: PatroniAuth | None = None,
) -> str:
    """Planned switchover from `leader` to `candidate`; Patroni does it synchronously and answers
    once the candidate has taken over (or says why not)."""
    body = {"leader": leader, "candidate": candidate}
    return await _post(session, member, "/switchover", body, auth, 60, f"switchover {leader} -> {candidate}")


async def restart_pending(
    session: aiohttp.ClientSession, member: Endpoint, auth: PatroniAuth | None = None
) -> str:
    """POST /restart on one member, only if it still waits for a restart (Patroni checks that itself, so
    a restart that already happened is not repeated). Patroni answers once PostgreSQL is back up."""
    return await _post(
        session, member, "/restart", {"restart_pending": True}, auth, 120, f"restart on {member}"
    )


async def restart(session: aiohttp.ClientSession, member: Endpoint, auth: PatroniAuth | None = None) -> str:
    """POST /restart on one member unconditionally (a restart a user asked for, kubectl pgc restart);
    Patroni answers once PostgreSQL is back up."""
    return await _post(session, member, "/restart", {}, auth, 120, f"restart on {member}")


async def patch_config(
    session: aiohttp.ClientSession,
    member: Endpoint,
    patch: Mapping[str, Any],
    auth: PatroniAuth | None = None,
) -> None:
    """PATCH /config: Patroni merges the body into its dynamic configuration (null removes a key) and
    every member applies it on its next loop."""
    pod_ip = str(member)
    try:
        async with session.patch(
            member.url("/config"),
            json=dict(patch),
            headers=_auth_headers(auth),
            timeout=TIMEOUT,
            **member.options(),
        ) as resp:
            if resp.status != 200:
                text = (await resp.text()).strip()
                raise PatroniError(f"PATCH /config on {pod_ip} refused: HTTP {resp.status}: {text}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PatroniError(f"PATCH /config on {pod_ip}: {type(e).__name__}: {e}") from None
