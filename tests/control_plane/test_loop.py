"""The control loop: every tick applies each non-hold decision and then lets the actuator reconcile its pool."""

from __future__ import annotations

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.loop import ControlLoop, node_lead
from control_plane.reports import ReplicaRegistry
from control_plane.scaling.decisions import Decision, Hold
from fleet.spec.stack import FleetSpec, PoolSpec
from tests.control_plane.conftest import Clock
from tests.support import stacks


class Recording(Actuator):
    """Reports a fixed replica count and records what the loop asks of it."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.applied: list[Decision] = []
        self.reconciled: list[tuple[str, int]] = []
        self.nodes_for: list[int | None] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise NotImplementedError

    async def current(self, pool: PoolSpec) -> FleetView:
        return FleetView(self.replicas)

    async def apply(self, decision: Decision) -> None:
        self.applied.append(decision)

    async def reconcile(self, pool: PoolSpec, target: int, nodes_for: int | None = None) -> None:
        self.reconciled.append((pool.name, target))
        self.nodes_for.append(nodes_for)


async def test_every_tick_reconciles_each_pool_with_its_target_even_on_hold() -> None:
    spec = stacks.spec("local")
    actuator = Recording(replicas=spec.pools[0].replicas.min)
    loop = ControlLoop(spec, ReplicaRegistry(spec.control_plane.stale_after_s), actuator, Clock(1000.0))
    decisions = await loop.tick(1000.0)
    assert [type(d) for d in decisions] == [Hold] * len(spec.pools)  # no reports: hold, unknown is not zero
    assert actuator.applied == []
    assert actuator.reconciled == [(d.pool, d.target) for d in decisions]


def test_only_the_aws_actuator_provisions_nodes_a_node_start_ahead() -> None:
    aws = stacks.spec("aws", **{"gpuNodeGroups.0.nodeColdStartSeconds": 480, "autoscaling.actuator": "aws"})
    assert node_lead(aws, aws.pools[0]) == 480.0
    kubernetes = stacks.spec("aws", **{"autoscaling.actuator": "kubernetes"})
    assert node_lead(kubernetes, kubernetes.pools[0]) == 0.0
    local = stacks.spec("local")
    assert node_lead(local, local.pools[0]) == 0.0
