"""A control plane that just started scales nothing and lists no replicas to gateways until the agents alive have
reported: for ``hold_s`` at most, or until every replica the actuator names has reported."""

from __future__ import annotations

import argparse

import httpx

from agent import cli as agent_cli
from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.api.app import create_app
from control_plane.loop import ControlLoop
from control_plane.plane import ControlPlane
from control_plane.reports import ReplicaRegistry
from control_plane.scaling.decisions import Decision, Hold, ScaleUp
from control_plane.startup import AGENT_REPORT_BACKOFF_MAX_S, StartupHold, hold_for
from fleet.protocol.control_api import ApiServer, bind
from fleet.spec.stack import FleetSpec, PoolSpec
from tests.control_plane.builders import report
from tests.control_plane.conftest import Clock
from tests.support import stacks

T0 = 1000.0


class Fixed(Actuator):
    """A pool of ``target`` replicas, named when ``names`` is given; records what the loop asks of it."""

    def __init__(self, target: int, names: tuple[str, ...] | None = None) -> None:
        self.view = FleetView(target, names)
        self.applied: list[Decision] = []
        self.reconciled: list[int] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise NotImplementedError

    async def current(self, pool: PoolSpec) -> FleetView:
        return self.view

    async def apply(self, decision: Decision) -> None:
        self.applied.append(decision)

    async def reconcile(self, pool: PoolSpec, target: int, nodes_for: int | None = None) -> None:
        self.reconciled.append(target)


def build(actuator: Actuator, hold_s: float = 5.0) -> tuple[ControlLoop, FleetSpec]:
    spec = stacks.spec("local-sim", **{"pools.0.replicas": {"min": 1, "max": 4}})
    loop = ControlLoop(
        spec, ReplicaRegistry(spec.control_plane.stale_after_s), actuator, Clock(T0), startup_hold_s=hold_s
    )
    return loop, spec


def test_the_hold_outlasts_an_agents_report_backoff() -> None:
    fast = stacks.spec("local-sim", **{"controlPlane.reportIntervalS": 0.5, "controlPlane.staleAfterS": 4})
    assert hold_for(fast) == 10.5  # the backoff cap, then the report itself
    slow = {"controlPlane.reportIntervalS": 20, "controlPlane.staleAfterS": 60}
    assert hold_for(stacks.spec("local-sim", **slow)) == 60
    assert hold_for(stacks.spec("local-sim", **{"controlPlane.reportIntervalS": 20})) == 40
    agent = argparse.ArgumentParser()
    agent_cli.add_arguments(agent)
    assert agent.get_default("report_backoff_max") == AGENT_REPORT_BACKOFF_MAX_S
    hold = StartupHold(T0, 5.0)
    assert not hold.settled("p", T0 + 4.9) and hold.settled("p", T0 + 5.0)
    assert not hold.settle("p", T0, ["a", "b"], ["a"]) and not hold.settle("p", T0, None, ["a", "b"])
    assert hold.settle("p", T0, ["a", "b"], ["a", "b", "c"]) and hold.settled("p", T0)  # and stays settled


async def test_no_decision_is_applied_until_the_hold_has_passed() -> None:
    actuator = Fixed(target=1)  # a Deployment's count: no names, so only time settles it
    loop, spec = build(actuator)
    pool = spec.pools[0].name
    loop.registry.record(report("r1", pool=pool, waiting=60, running=64, ts=T0), T0)  # a queue worth scaling for
    [held] = await loop.tick(T0 + 1)
    assert isinstance(held, Hold) and held.reason.startswith("starting: waiting up to 4.0 s more")
    assert held.inputs["reported"] == ["r1"]
    assert actuator.applied == [] and actuator.reconciled == []  # not even the slow resources converge

    loop.registry.record(report("r1", pool=pool, waiting=60, running=64, ts=T0 + 5), T0 + 5)
    [decision] = await loop.tick(T0 + 5)
    assert isinstance(decision, ScaleUp) and actuator.applied == [decision] and actuator.reconciled == [decision.target]


async def test_a_pool_whose_named_replicas_all_reported_is_settled_early() -> None:
    actuator = Fixed(target=2, names=("r1", "r2"))  # the local actuator after adopting two agents
    loop, spec = build(actuator, hold_s=60.0)
    pool = spec.pools[0].name
    loop.registry.record(report("r1", pool=pool, ts=T0), T0)
    [held] = await loop.tick(T0 + 1)
    assert held.reason.startswith("starting:")
    loop.registry.record(report("r2", pool=pool, ts=T0 + 1), T0 + 1)
    [decision] = await loop.tick(T0 + 1.5)
    assert not decision.reason.startswith("starting:") and actuator.reconciled == [decision.target]

    first_start = Fixed(target=0, names=())  # no agents to wait for
    fresh, _ = build(first_start, hold_s=60.0)
    [decision] = await fresh.tick(T0)
    assert isinstance(decision, ScaleUp) and first_start.applied == [decision]  # up to the pool's minimum


async def test_discovery_is_503_until_the_pool_is_settled() -> None:
    clock = Clock(T0)
    spec = stacks.spec("local-sim")
    pool = spec.pools[0].name
    cp = ControlPlane.build(spec, clock, Fixed(1), startup_hold_s=5.0)
    server = ApiServer(create_app(cp), bind("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as http:
            body = report("r1", pool=pool, ts=T0).model_dump(mode="json")
            assert (await http.post("/v1/reports", json=body)).status_code == 200
            early = await http.get(f"/v1/pools/{pool}/replicas")
            assert early.status_code == 503 and early.json()["error"]["type"] == "service_unavailable"
            assert (await http.get("/v1/pools")).status_code == 200  # the other reads are not held
            clock.now = T0 + 5
            listed = await http.get(f"/v1/pools/{pool}/replicas")
            assert listed.status_code == 200 and [r["replica"] for r in listed.json()["replicas"]] == ["r1"]
    finally:
        await server.stop()
