"""The control loop: every tick applies each non-hold decision and then lets the actuator reconcile its pool."""

from __future__ import annotations

from autoscaler.actuators import Actuator, ActuatorEnv, FleetView
from autoscaler.decisions import Decision, Hold
from autoscaler.loop import ControlLoop
from autoscaler.registry import ReplicaRegistry
from fleet.spec import FleetSpec, PoolSpec
from tests.support import stacks


class Recording(Actuator):
    """Reports a fixed replica count and records what the loop asks of it."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.applied: list[Decision] = []
        self.reconciled: list[tuple[str, int]] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise NotImplementedError

    async def current(self, pool: PoolSpec) -> FleetView:
        return FleetView(self.replicas)

    async def apply(self, decision: Decision) -> None:
        self.applied.append(decision)

    async def reconcile(self, pool: PoolSpec, target: int) -> None:
        self.reconciled.append((pool.name, target))


async def test_every_tick_reconciles_each_pool_with_its_target_even_on_hold() -> None:
    spec = stacks.spec("local")
    actuator = Recording(replicas=spec.pools[0].replicas.min)
    loop = ControlLoop(spec, ReplicaRegistry(spec.control_plane.stale_after_s), actuator, lambda: 1000.0)
    decisions = await loop.tick(1000.0)
    assert [type(d) for d in decisions] == [Hold] * len(spec.pools)  # no reports: hold, unknown is not zero
    assert actuator.applied == []
    assert actuator.reconciled == [(d.pool, d.target) for d in decisions]
