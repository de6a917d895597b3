"""HTTP endpoints: /healthz and /readyz on the health port, /metrics (Prometheus) on the metrics port."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pg_operator.controller.metrics import Metrics


@dataclass
class HealthState:
    """What the probes report. `ready` is computed by the operator loop."""

    role: str = "starting"  # starting | candidate | leader | stopping
    ready: Callable[[], bool] = field(default=lambda: False)
    detail: Callable[[], dict[str, object]] = field(default=lambda: {})


class HealthServer:
    def __init__(
        self, state: HealthState, metrics: Metrics, *, bind: str, health_port: int, metrics_port: int
    ):
        self.state = state
        self.metrics = metrics
        self.bind = bind
        self.health_port = health_port
        self.metrics_port = metrics_port
        self._runners: list[web.AppRunner] = []

    def _body(self) -> dict[str, object]:
        return {"role": self.state.role, **self.state.detail()}

    async def healthz(self, _: web.Request) -> web.Response:
        # The event loop answering is the liveness signal; a lost lease exits the process instead.
        return web.json_response({"ok": True, **self._body()})

    async def readyz(self, _: web.Request) -> web.Response:
        ready = self.state.ready()
        return web.Response(
            status=200 if ready else 503,
            content_type="application/json",
            text=json.dumps({"ready": ready, **self._body()}),
        )

    async def metrics_handler(self, _: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _serve(self, routes: list[web.RouteDef], port: int) -> None:
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.bind, port).start()
        self._runners.append(runner)

    async def start(self) -> None:
        health = [web.get("/healthz", self.healthz), web.get("/readyz", self.readyz)]
        metrics = [web.get("/metrics", self.metrics_handler)]
        if self.health_port == self.metrics_port:
            await self._serve(health + metrics, self.health_port)
        else:
            await self._serve(health, self.health_port)
            await self._serve(metrics, self.metrics_port)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
