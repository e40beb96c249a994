"""The paid floor guard-rail: a pool on nodes paid at their minimum keeps the replicas those nodes hold."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.loop import ControlLoop
from control_plane.reports import ReplicaRegistry
from control_plane.scaling.decisions import Hold, ScaleDown, ScaleUp
from control_plane.scaling.guardrails import GuardrailState, apply_guardrails
from control_plane.scaling.policies import Proposal, make_policy
from control_plane.scaling.step import ScalingState, decide
from fleet.capacity.paid_floor import PaidFloor, paid_floor
from tests.control_plane.builders import autoscaling, context, ready
from tests.control_plane.conftest import Clock
from tests.control_plane.test_loop import Recording
from tests.support import stacks


def _guard(replicas: int, desired: float, state: GuardrailState | None = None, **ctx: Any) -> Any:
    fields: dict[str, Any] = {"max_replicas": 24, "paid_floor": 24, "paid_gpus": 24, **ctx}
    c = context(*(ready(f"r{i}") for i in range(replicas)), **fields)
    return apply_guardrails(c, Proposal(desired, "policy"), autoscaling(max_scale_up_step=100), state)


@pytest.mark.parametrize(
    ("case", "replicas", "desired", "ctx", "target"),
    [
        ("an idle pool grows to the floor", 3, 1, {}, 24),
        ("the floor holds a pool that wants fewer", 24, 2, {}, 24),
        ("demand above the floor is not held back", 20, 30, {"max_replicas": 30}, 30),
        ("no floor: the policy's number", 3, 1, {"paid_floor": 0, "paid_gpus": 0}, 3),  # stabilising at 3
        ("a floor above max (a rollout's bounds) stops at max", 3, 1, {"max_replicas": 6}, 6),
    ],
)
def test_paid_floor_guardrail(case: str, replicas: int, desired: float, ctx: dict[str, Any], target: int) -> None:
    assert _guard(replicas, desired, **ctx).target == target, case


def test_the_reason_says_the_paid_gpus_fill() -> None:
    verdict = _guard(3, 1)
    assert verdict.reason.startswith("filling paid nodes: 24 GPUs paid hold 24 replicas")
    assert verdict.inputs["paid_floor"] == 24


def test_the_floor_survives_the_scale_down_window() -> None:
    state = GuardrailState()
    for now in (0.0, 300.0, 700.0, 1400.0):
        verdict = _guard(24, 1, state, now=now)
        state = verdict.state
        assert verdict.target == 24


def _prod(**overrides: Any) -> Any:
    return stacks.spec("prod", **overrides)


def test_decide_on_prod_scales_three_idle_replicas_up_to_the_paid_floor() -> None:
    spec = _prod()
    pool = spec.pools[0]
    policy = make_policy(spec.autoscaling.policy.name, spec.autoscaling.policy.params)
    idle = tuple(ready(f"r{i}") for i in range(3))
    step = decide(pool, spec.autoscaling, policy, idle, 0.0, paid=paid_floor(spec, pool))
    assert isinstance(step.decision, ScaleUp)
    assert step.decision.target == 3 + spec.autoscaling.max_scale_up_step
    assert "filling paid nodes: 24 GPUs paid" in step.decision.reason
    full = tuple(ready(f"r{i}") for i in range(24))
    state = ScalingState()
    for now in (0.0, 600.0, 1200.0):
        step = decide(pool, spec.autoscaling, policy, full, now, paid=paid_floor(spec, pool), state=state)
        state = step.state
        assert isinstance(step.decision, Hold) and step.decision.target == 24


def test_the_live_loop_feeds_the_paid_floor_and_fill_paid_nodes_false_turns_it_off() -> None:
    spec = _prod()
    assert {p.name: (f := _loop(spec).paid(p)) and f.replicas for p in spec.pools} == {"qwen-7b": 24}
    off = _prod(**{"pools.0.replicas.fillPaidNodes": False})
    assert [_loop(off).paid(p) for p in off.pools] == [None]


def _loop(spec: Any) -> ControlLoop:
    registry = ReplicaRegistry(spec.control_plane.stale_after_s)
    return ControlLoop(spec, registry, Recording(replicas=3), Clock(1000.0))


def test_a_pool_yields_paid_gpus_past_its_scale_down_window_but_within_its_step_limit() -> None:
    # Held at 12 by the floor, wanting 3, capped at 5 while another pool wants the GPUs: the scale-down window
    # (which would hold 12) does not apply; the step limit (one a tick) still does.
    verdict = _guard(12, 3, paid_floor=5, paid_cap=5, now=0.0)
    assert verdict.target == 11
    assert "yielding paid GPUs" in verdict.reason and verdict.inputs["paid_cap"] == 5


def test_a_pool_never_yields_below_its_own_want() -> None:
    verdict = _guard(12, 12, paid_floor=5, paid_cap=5, now=0.0)
    assert verdict.target == 12 and "yielding" not in verdict.reason


def test_without_a_cap_the_scale_down_window_holds() -> None:
    assert _guard(12, 3, paid_floor=5, now=0.0).target == 12


def test_a_yielding_pool_stops_its_victims_instead_of_putting_them_to_sleep() -> None:
    spec = stacks.spec("prod-two-models")
    pool = spec.pools[0]
    assert pool.engine.sleep_mode
    policy = make_policy(spec.autoscaling.policy.name, spec.autoscaling.policy.params)
    loads = tuple(ready(f"r{i}") for i in range(12))
    capped = decide(pool, spec.autoscaling, policy, loads, 0.0, paid=PaidFloor(5, 24, cap=5))
    assert isinstance(capped.decision, ScaleDown)
    assert capped.decision.sleep == () and len(capped.decision.victims) == 1  # one a tick: the step limit


def test_the_live_loop_moves_the_split_by_the_pools_last_decisions() -> None:
    spec = stacks.spec("prod-two-models", **{"gpuNodeGroups.0.paidSplit": "demand"})
    loop = _loop(spec)
    qwen, llama = spec.pools
    assert [(f := loop.paid(p)) and f.replicas for p in spec.pools] == [12, 12]  # nothing decided yet: even
    loop.last = {
        qwen.name: Hold(qwen.name, 12, 12, "", 0.0, {"want": 20, "draining": 0}),
        llama.name: Hold(llama.name, 12, 12, "", 0.0, {"want": 3, "draining": 0}),
    }
    assert loop.paid(llama) == PaidFloor(3, 24, cap=3)  # yields to qwen, which wants 20
    assert loop.paid(qwen) == PaidFloor(12, 24)  # no GPU is free yet
