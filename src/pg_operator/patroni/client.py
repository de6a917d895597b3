"""A small async client for the Patroni REST API of one cluster's instances.

The operator reads the members' view (GET /cluster: roles, state, timeline, lag), asks for planned
switchovers (POST /switchover), keeps the dynamic configuration (PATCH /config) and restarts members
that wait for a restart (POST /restart). Unsafe endpoints are protected by basic auth when the cluster's
instances were configured with REST API credentials; those are passed in, never logged.
"""

from __future__ import annotations

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


def base_url(pod_ip: str, port: int = PATRONI_PORT) -> str:
    return f"http://{pod_ip}:{port}"


async def get_cluster(session: aiohttp.ClientSession, pod_ip: str,
                      port: int = PATRONI_PORT) -> Mapping[str, Any]:
    """GET /cluster from any member: every member answers with the whole cluster's view."""
    try:
        async with session.get(f"{base_url(pod_ip, port)}/cluster", timeout=TIMEOUT) as resp:
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


async def _post(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], auth: PatroniAuth | None,
                limit_s: float, what: str) -> str:
    """POST a JSON body to an unsafe endpoint; Patroni's answer, or PatroniError naming `what`."""
    limit = aiohttp.ClientTimeout(total=limit_s, connect=2)
    try:
        async with session.post(url, json=dict(body), headers=_auth_headers(auth), timeout=limit) as resp:
            text = (await resp.text()).strip()
            if resp.status != 200:
                raise PatroniError(f"{what} refused: HTTP {resp.status}: {text}")
            return text
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PatroniError(f"{what}: {type(e).__name__}: {e}") from None


async def switchover(session: aiohttp.ClientSession, pod_ip: str, leader: str, candidate: str,
                     auth: PatroniAuth | None = None, port: int = PATRONI_PORT) -> str:
    """Planned switchover from `leader` to `candidate`; Patroni does it synchronously and answers
    once the candidate has taken over (or says why not)."""
    body = {"leader": leader, "candidate": candidate}
    return await _post(session, f"{base_url(pod_ip, port)}/switchover", body, auth, 60,
                       f"switchover {leader} -> {candidate}")


async def restart_pending(session: aiohttp.ClientSession, pod_ip: str, auth: PatroniAuth | None = None,
                          port: int = PATRONI_PORT) -> str:
    """POST /restart on one member, only if it still waits for a restart (Patroni checks that itself, so
    a restart that already happened is not repeated). Patroni answers once PostgreSQL is back up."""
    return await _post(session, f"{base_url(pod_ip, port)}/restart", {"restart_pending": True}, auth, 120,
                       f"restart on {pod_ip}")


async def patch_config(session: aiohttp.ClientSession, pod_ip: str, patch: Mapping[str, Any],
                       auth: PatroniAuth | None = None, port: int = PATRONI_PORT) -> None:
    """PATCH /config: Patroni merges the body into its dynamic configuration (null removes a key) and
    every member applies it on its next loop."""
    url = f"{base_url(pod_ip, port)}/config"
    try:
        async with session.patch(url, json=dict(patch), headers=_auth_headers(auth), timeout=TIMEOUT) as resp:
            if resp.status != 200:
                text = (await resp.text()).strip()
                raise PatroniError(f"PATCH /config on {pod_ip} refused: HTTP {resp.status}: {text}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PatroniError(f"PATCH /config on {pod_ip}: {type(e).__name__}: {e}") from None
