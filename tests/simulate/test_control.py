"""The simulation's control step and the live control loop take the same decisions on the same reports."""

from __future__ import annotations

import pytest

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.loop import ControlLoop
from control_plane.reports import GatewayRegistry, ReplicaRegistry
from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision, ScaleDown, ScaleUp
from fleet.protocol.clock import SystemClock
from fleet.protocol.wire import GatewayReport, LoadReport
from fleet.spec.stack import FleetSpec, PoolSpec
from simulate.control import Controller
from tests.support import stacks


class Fleet(Actuator):
    """The replica names the test's fleet runs; the loop's decisions are applied by the test, not here."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise NotImplementedError

    async def current(self, pool: PoolSpec) -> FleetView:
        return FleetView(len(self.names), tuple(self.names))

    async def apply(self, decision: Decision) -> None:
        pass

    async def reconcile(self, pool: PoolSpec, target: int, nodes_for: int | None = None) -> None:
        pass


def _load(t: float) -> float:
    """Requests per ready replica's worth of pool demand: a ramp, a plateau, a drop."""
    if t < 300:
        return 40 + 0.8 * t
    if t < 700:
        return 280.0
    return 30.0


def _comparable(d: Decision) -> tuple[object, ...]:
    inputs = {k: v for k, v in d.inputs.items() if k != "replicas"}
    victims = d.victims if isinstance(d, ScaleDown) else ()
    return (d.kind, d.current, d.target, d.reason, victims, sorted(inputs.items(), key=lambda kv: kv[0]))


@pytest.mark.parametrize("fill", [False, True])
async def test_live_loop_and_simulation_decide_alike_on_one_report_sequence(fill: bool) -> None:
    # fillPaidNodes off, the scaler itself goes up and down with the load; on (prod as shipped) both hold the
    # paid floor the same way.
    spec = stacks.spec(
        "prod",
        **{
            "autoscaling.scaleDownStabilizationS": 60,
            "autoscaling.policy.params": {"releaseTimeConstantS": 120},
            "pools.0.replicas.fillPaidNodes": fill,
        },
    )
    pool = spec.pools[0]
    assert spec.autoscaling.predictive  # the predictive term reads the demand window: the two must share it
    names = [f"r{i}" for i in range(pool.replicas.min)]
    launched_at = dict.fromkeys(names, -1000.0)
    fleet = Fleet(names)
    registry = ReplicaRegistry(spec.control_plane.stale_after_s)
    gateways = GatewayRegistry(spec.control_plane.stale_after_s)
    now = 0.0
    loop = ControlLoop(spec, registry, fleet, SystemClock(), gateways=gateways)  # each tick is given its time
    sim = Controller.for_pool(spec, pool)
    counter = len(names)
    kinds: set[str] = set()
    reasons: list[str] = []
    for tick in range(100):
        now = tick * spec.autoscaling.interval_s
        ready = [n for n in names if now - launched_at[n] >= pool.cold_start_seconds]
        total = _load(now)
        loads: list[ReplicaLoad] = []
        for n in names:
            if n not in ready:
                loads.append(ReplicaLoad(n, "launching"))
                continue
            running = min(256.0, total / len(ready))
            waiting = max(0.0, total / len(ready) - running)
            kv = running * 280 / 1_100_000
            ttft = 0.12 + 0.002 * running
            registry.record(
                LoadReport(
                    replica=n,
                    pool=pool.name,
                    engine_url=f"http://127.0.0.1:1/{n}",
                    state="ready",
                    waiting=waiting,
                    running=running,
                    kv_usage=kv,
                    ttft_p99_s=ttft,
                    tokens_per_s=running * 30,
                    model="qwen2.5-7b-instruct",
                    engine_version="0.33.0",
                    ts=now,
                ),
                now,
            )
            loads.append(ReplicaLoad(n, "ready", False, waiting, running, kv, ttft, running * 30, 0.0))
        report = GatewayReport(
            gateway="gw-0",
            pool=pool.name,
            waiting=int(total // 50),
            in_flight=int(total),
            arrived_per_s=total / 8,
            admitted_per_s=total / 8,
            window_s=10.0,
            ts=now,
        )
        gateways.record(report, now)
        [live] = await loop.tick(now)
        simulated = sim.step(now, tuple(loads), report)
        assert _comparable(live) == _comparable(simulated), f"tick at {now}s"
        kinds.add(live.kind)
        reasons.append(live.reason)
        if isinstance(live, ScaleUp):
            for _ in range(live.target - live.current):
                names.append(f"r{counter}")
                launched_at[f"r{counter}"] = now
                counter += 1
        elif isinstance(live, ScaleDown):
            for victim in live.victims:
                names.remove(victim)
    if fill:
        assert "scale-down" not in kinds and any(r.startswith("filling paid nodes: 24 GPUs paid") for r in reasons)
        return
    assert kinds == {"hold", "scale-up", "scale-down"}
    assert any(r.startswith("predictive") for r in reasons)
