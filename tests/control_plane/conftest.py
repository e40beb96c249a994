"""Fixtures: a control plane served by uvicorn over real HTTP on a free loopback port, with a settable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from aiohttp import web

from control_plane.actuators import ActuatorEnv, DryRun, FleetView
from control_plane.actuators.local import LocalActuator
from control_plane.api.app import create_app
from control_plane.loop import ControlLoop
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import ApiServer, bind
from fleet.spec.stack import PoolSpec
from gateway.metrics import GatewayMetrics
from tests.support import stacks


class Clock:
    """A `fleet.protocol.clock.Clock` tests move by hand: ``now`` is its wall and its monotonic time."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class ReportedOnly(LocalActuator):
    """Actuator view = whatever replicas reported (no processes); wrapped in DryRun so nothing acts."""

    async def current(self, pool: PoolSpec) -> FleetView:
        del pool  # Unused.
        return FleetView(0)


@dataclass
class Served:
    cp: ControlPlane
    loop: ControlLoop
    clock: Clock
    http: httpx.AsyncClient
    url: str
    dry: DryRun


def build_control_plane(clock: Clock, **overrides: object) -> tuple[ControlPlane, ControlLoop, DryRun]:
    """A control plane over the local stack (changed by ``overrides``, as `stacks.spec` takes them) whose loop
    decides but never acts (a dry-run over reports only)."""
    spec = stacks.spec("local", **{"autoscaling.scaleDownStabilizationS": 20.0, **overrides})
    dry = DryRun(ReportedOnly(spec, ActuatorEnv(stack="local", control_plane_url="http://unused")))
    cp = ControlPlane.build(spec, clock, dry)
    assert cp.loop is not None
    return cp, cp.loop, dry


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    clock = Clock()
    cp, loop, dry = build_control_plane(clock)
    server = ApiServer(create_app(cp), bind("127.0.0.1", 0))
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        yield Served(cp, loop, clock, http, url, dry)
    await cp.close()
    await dry.close()
    await server.stop()


@dataclass
class GatewayAdmin:
    """A gateway's admin port on loopback serving the /metrics of ``metrics`` (the gateway's own series)."""

    metrics: GatewayMetrics
    port: int


@pytest.fixture
async def gateway_admin() -> AsyncIterator[GatewayAdmin]:
    metrics = GatewayMetrics()

    async def scrape(request: web.Request) -> web.Response:
        del request  # Unused.
        return web.Response(body=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield GatewayAdmin(metrics, runner.addresses[0][1])
    await runner.cleanup()
