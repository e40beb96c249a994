"""Departures: a replica that dies is replaced once, and its starting replacement is never scaled in.

The replay drives the control loop tick by tick (explicit times) through the agent-SIGKILL sequence the fault suite
showed (docs/benchmarks.md, "agent SIGKILL"), over an actuator that names its replicas as the local one does: two
ready replicas share the load; one agent is killed (its process gone from the actuator at once); the survivor takes
all the load and the loop launches one replacement; then the survivor's load dips for a few seconds (the proposal
falls under one replica) while the replacement is still starting.
"""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.loop import ControlLoop
from control_plane.reports import ReplicaRegistry
from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision, ScaleDown, ScaleUp
from control_plane.scaling.departures import Departures, observe
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import FleetSpec, PoolSpec
from tests.control_plane.builders import ready, report, stale
from tests.control_plane.conftest import Clock
from tests.support import stacks

POOL = "qwen-7b"
COLD_START_S = 8.0


class Processes(Actuator):
    """Named replicas, launched and stopped at once, as the local actuator's agents are; ``kill`` takes one away
    the way a SIGKILL does (the actuator reaps it, nothing drains)."""

    def __init__(self, *names: str) -> None:
        self.running = list(names)
        self.launched: list[str] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise NotImplementedError

    async def current(self, pool: PoolSpec) -> FleetView:
        return FleetView(len(self.running), tuple(self.running))

    async def apply(self, decision: Decision) -> None:
        if isinstance(decision, ScaleUp):
            for _ in range(decision.starts):
                self.launched.append(f"{POOL}-new-{len(self.launched) + 1}")
                self.running.append(self.launched[-1])
        elif isinstance(decision, ScaleDown):
            self.running = [r for r in self.running if r not in decision.victims]

    def kill(self, replica: str) -> None:
        self.running.remove(replica)


def spec() -> FleetSpec:
    return stacks.spec(
        "local",
        **{
            "pools.0.replicas": {"min": 1, "max": 3},
            "pools.0.coldStartSeconds": COLD_START_S,
            "pools.0.engine.maxNumSeqs": 16,
            "autoscaling.intervalS": 0.5,
            "autoscaling.scaleDownStabilizationS": 1.0,
            "autoscaling.policy": {"name": "target-tracking", "params": {"releaseTimeConstantS": 0}},
            "controlPlane.staleAfterS": 2,
            "controlPlane.reportIntervalS": 0.25,
        },
    )


def demand(t: float, killed_at: float) -> float:
    """Requests running in the pool, shared by its ready replicas: steady, with a dip 2-5 s after the kill."""
    return 4.0 if killed_at + 2 <= t < killed_at + 5 else 16.0


async def replay(fixed: bool = True) -> tuple[list[Decision], Processes]:
    """The sequence of the module docstring; returns the decision log and the actuator."""
    cluster = spec()
    registry = ReplicaRegistry(cluster.control_plane.stale_after_s, cluster.control_plane.forget_after)
    actuator = Processes(f"{POOL}-1", f"{POOL}-2")
    loop = ControlLoop(cluster, registry, actuator, Clock(0.0))
    started: dict[str, float] = {}
    killed_at = 5.0
    for tick in range(60):
        t = tick * 0.5
        if t == killed_at:
            actuator.kill(f"{POOL}-1")
        starting = {
            r for r in actuator.running if r.startswith(f"{POOL}-new") and t - started.setdefault(r, t) < COLD_START_S
        }
        serving = [r for r in actuator.running if r not in starting]
        for replica in starting:
            registry.record(report(replica, state="starting", waiting=None, running=None), t)
        for replica in serving:
            registry.record(report(replica, running=demand(t, killed_at) / len(serving), waiting=0.0), t)
        if not fixed:
            loop._departures.clear()  # what the loop did before it carried departures
        await loop.tick(t)
    return list(loop.decisions), actuator


async def test_a_killed_agent_is_replaced_once_and_its_starting_replacement_is_not_scaled_in() -> None:
    decisions, actuator = await replay()
    ups = [d for d in decisions if isinstance(d, ScaleUp)]
    assert [(d.current, d.target) for d in ups] == [(1, 2)], decisions
    assert actuator.launched == [f"{POOL}-new-1"]
    replacement = actuator.launched[0]
    downs = [d for d in decisions if isinstance(d, ScaleDown)]
    assert all(replacement not in d.victims for d in downs), downs
    holds = [d.reason for d in decisions if "replacing" in d.reason]
    assert holds and f"replacing {POOL}-1" in holds[0]


async def test_without_departures_the_replacement_is_scaled_in_and_launched_again() -> None:
    decisions, actuator = await replay(fixed=False)  # the check above can fail: this is the flap it catches
    assert len(actuator.launched) >= 2
    assert any(isinstance(d, ScaleDown) and actuator.launched[0] in d.victims for d in decisions)


def _serving(*names: str) -> tuple[ReplicaLoad, ...]:
    return tuple(ready(n) for n in names)


@pytest.mark.parametrize(
    ("case", "before", "removing", "after", "dead"),
    [
        ("gone from the actuator", _serving("a", "b"), (), _serving("b"), ("a",)),
        ("its report stale", _serving("a", "b"), (), (stale("a"), ready("b")), ("a",)),
        ("a scale-down victim leaving", _serving("a", "b"), ("a",), _serving("b"), ()),
        (
            "a victim draining, then gone",
            _serving("a", "b"),
            ("a",),
            (ReplicaLoad("a", ReplicaState.DRAINING), ready("b")),
            (),
        ),
        ("a launch placeholder replaced", (ReplicaLoad("pending-0", ReplicaState.LAUNCHING),), (), _serving("c"), ()),
        ("a starting replica gone", (ReplicaLoad("s", ReplicaState.STARTING),), (), (), ("s",)),
    ],
)
def test_what_counts_as_a_death(
    case: str, before: tuple[ReplicaLoad, ...], removing: tuple[str, ...], after: tuple[ReplicaLoad, ...], dead: Any
) -> None:
    first = observe(Departures(), before, 100.0, COLD_START_S).expect(removing, 100.0)
    assert observe(first, after, 100.5, COLD_START_S).replacing == dead, case


def test_a_death_is_remembered_for_the_window_and_counted_once() -> None:
    departures = observe(Departures(), _serving("a", "b"), 100.0, COLD_START_S)
    departures = observe(departures, (stale("a"), ready("b")), 101.0, COLD_START_S)
    departures = observe(departures, _serving("b"), 102.0, COLD_START_S)  # then forgotten: the same death
    assert departures.dead == (("a", 101.0),)
    assert observe(departures, _serving("b"), 101.0 + COLD_START_S, COLD_START_S).replacing == ("a",)
    assert observe(departures, _serving("b"), 101.5 + COLD_START_S, COLD_START_S).replacing == ()
