"""Fixtures: a control plane served over real HTTP on a free loopback port, with a settable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from aiohttp import web

from autoscaler.actuators import DryRun, FleetView
from autoscaler.actuators.local import LocalActuator
from autoscaler.loop import ControlLoop
from autoscaler.registry import ReplicaRegistry
from autoscaler.service import ControlPlane, create_app
from fleet.loader import load_spec
from fleet.spec import FleetSpec, PoolSpec


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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


def local_spec(**autoscaling: object) -> FleetSpec:
    spec = load_spec("local").spec
    if autoscaling:
        spec = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update=autoscaling)})
    return spec


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    spec = local_spec(scale_down_stabilization_s=20.0)
    clock = Clock()
    from autoscaler.actuators import ActuatorEnv

    dry = DryRun(ReportedOnly(spec, ActuatorEnv(stack="local", control_plane_url="http://unused")))
    loop = ControlLoop(spec, ReplicaRegistry(spec.control_plane.stale_after_s), dry, clock)
    cp = ControlPlane.build(spec, clock, loop)
    runner = web.AppRunner(create_app(cp))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        yield Served(cp, loop, clock, http, url, dry)
    await dry.close()
    await runner.cleanup()
