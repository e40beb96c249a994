"""Guard-rails: bounds, stabilisation, step limits, cold start, SLO priority and the predictive term."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.guardrails import GuardrailState, apply_guardrails, demand_trend
from control_plane.scaling.policies import Proposal
from tests.control_plane.builders import autoscaling, context, ready, stale, starting


def guard(ctx: ScalingContext, desired: float, state: GuardrailState | None = None, **cfg: Any) -> Any:
    return apply_guardrails(ctx, Proposal(desired, "policy"), autoscaling(**cfg), state)


@pytest.mark.parametrize(
    ("case", "replicas", "desired", "cfg", "target"),
    [
        ("fast scale-up on queue growth", [ready("a", waiting=40)], 3, {}, 3),
        ("step limit up", [ready("a")], 9, {"max_scale_up_step": 2}, 3),
        ("capped at max", [ready("a")], 20, {"max_scale_up_step": 100}, 8),
        ("min restored at once", [], 0, {}, 1),
        ("starting replicas count as arriving capacity", [ready("a"), starting("b")], 2, {}, 2),
        ("stale replica is not idle capacity: replaced", [ready("a", waiting=8), stale("b")], 2, {}, 3),
        ("scale-down waits for the window", [ready("a"), ready("b")], 1, {}, 2),
        (
            "no stabilisation window scales down at once",
            [ready("a"), ready("b")],
            1,
            {"scale_down_stabilization_s": 0},
            1,
        ),
        ("step limit down", [ready("a"), ready("b"), ready("c")], 1, {"scale_down_stabilization_s": 0}, 2),
    ],
)
def test_guardrail_table(case: str, replicas: list, desired: float, cfg: dict, target: int) -> None:
    assert guard(context(*replicas), desired, **cfg).target == target, case


def test_stabilisation_delays_scale_down_until_the_window_has_passed() -> None:
    state = GuardrailState()
    targets = []
    for now in (0.0, 30.0, 59.0, 60.0):
        verdict = guard(context(ready("a"), ready("b"), now=now), 1, state)
        state = verdict.state
        targets.append(verdict.target)
    assert targets == [2, 2, 2, 1]
    assert "low for 60s" in verdict.reason


def test_scale_down_goes_only_as_low_as_the_highest_recent_recommendation() -> None:
    state = GuardrailState()
    replicas = [ready(n) for n in "abcd"]
    for now, desired in ((0.0, 3), (30.0, 1), (60.0, 1)):
        verdict = guard(context(*replicas, now=now), desired, state, max_scale_down_step=4)
        state = verdict.state
    assert verdict.target == 3


def test_a_burst_resets_the_scale_down_clock() -> None:
    state = GuardrailState()
    for now, desired in ((0.0, 1), (40.0, 3), (50.0, 1), (100.0, 1)):
        verdict = guard(context(ready("a"), ready("b"), now=now), desired, state)
        state = verdict.state
    assert verdict.target == 2 and "waits 10s more" in verdict.reason


def test_stale_replicas_block_scale_down_and_the_reason_says_so() -> None:
    verdict = guard(context(ready("a"), ready("b"), stale("c")), 0, scale_down_stabilization_s=0)
    assert verdict.target == 3
    assert "c" in verdict.inputs["unknown"] and "scale-down blocked" in verdict.reason


def test_a_failed_replica_is_replaced_and_does_not_block_scale_down() -> None:
    from control_plane.loop import pick_victims
    from control_plane.scaling.context import ReplicaLoad

    broken = ReplicaLoad("broken", "failed")
    assert guard(context(ready("a", waiting=6), broken), 2).target == 3  # replaced: not capacity
    ctx = context(ready("a"), ready("b"), broken)
    verdict = guard(ctx, 1, scale_down_stabilization_s=0)
    assert verdict.target == 2 and verdict.inputs["failed"] == ["broken"]
    assert pick_victims(ctx, 1) == ("broken",)


def test_ttft_breach_adds_a_replica_even_when_throughput_wants_fewer() -> None:
    ctx = context(ready("a", waiting=4, running=3, ttft=0.5), ready("b", ttft=0.2))
    verdict = guard(ctx, 1, scale_down_stabilization_s=0)
    assert verdict.target == 3 and verdict.reason.startswith("ttft")


@pytest.mark.parametrize(
    ("case", "queue_per_replica", "target"),
    [("no queue: nothing held", 1.0, 1), ("any P99 acts (0): held", 0.0, 2)],
)
def test_a_lagging_ttft_over_an_idle_pool_adds_nothing(case: str, queue_per_replica: float, target: int) -> None:
    cfg = {"scale_down_stabilization_s": 0, "ttft_queue_per_replica": queue_per_replica}
    assert guard(context(ready("a", ttft=0.5), ready("b")), 1, **cfg).target == target, case


def test_ttft_breach_waits_for_arriving_capacity_instead_of_adding_more() -> None:
    verdict = guard(context(ready("a", waiting=3, ttft=0.5), starting("b")), 1, scale_down_stabilization_s=0)
    assert verdict.target == 2


def test_ttft_near_the_slo_blocks_scale_down() -> None:
    verdict = guard(context(ready("a", waiting=2, ttft=0.28), ready("b")), 1, scale_down_stabilization_s=0)
    assert verdict.target == 2 and "within 20%" in verdict.reason


# Busy replicas, P99 at 2 s: with nothing waiting the misses are long prompts' prefill (the TTFT floor).
FLOOR = [ready(n, running=40, ttft=2.0) for n in "abc"]


@pytest.mark.parametrize(
    ("case", "waiting", "gateway_waiting", "target"),
    [
        ("floor-driven P99, nothing waiting: no replica, scale-down not blocked", 0, None, 2),
        ("floor-driven P99, a stray request waiting: still the floor", 1, None, 2),
        ("queueing in the engines: one more", 6, None, 4),
        ("queueing at the gateway: one more", 0, 30.0, 4),
    ],
)
def test_ttft_rule_acts_on_queueing_not_on_the_prefill_floor(
    case: str, waiting: float, gateway_waiting: float | None, target: int
) -> None:
    replicas = [ready("a", waiting=waiting, running=40, ttft=2.0), *FLOOR[1:]]
    ctx = context(*replicas, gateway_waiting=gateway_waiting)
    verdict = guard(ctx, 2, scale_down_stabilization_s=0)
    assert verdict.target == target, (case, verdict.reason)
    assert ("ttft_rule" in verdict.inputs) == (target == 2), case


def test_availability_outranks_throughput_when_below_min() -> None:
    ctx = context(stale("a"), min_replicas=2)
    verdict = guard(ctx, 0)
    assert verdict.target == 3 and verdict.reason.startswith("availability")


@pytest.mark.parametrize(
    ("history", "slope"),
    [((), 0.0), (((0, 1), (1, 2), (2, 3)), 1.0), (((0, 5), (10, 5), (20, 5)), 0.0), (((0, 9), (1, 6), (2, 3)), -3.0)],
)
def test_demand_trend(history: tuple, slope: float) -> None:
    assert demand_trend(history) == pytest.approx(slope)


def test_predictive_term_scales_ahead_of_a_rising_trend_only_when_enabled() -> None:
    history = tuple((1000.0 - 10 * i, 20.0 - 2 * i) for i in range(5))[::-1]  # +0.2 per second, now 20
    ctx = context(ready("a", waiting=4, running=16), demand_history=history)
    assert guard(ctx, 1).target == 1
    verdict = guard(ctx, 1, predictive=True)
    assert verdict.target == 2  # projected 20 + 0.2 * 30 = 26 -> 1.3 replicas
    assert verdict.reason.startswith("predictive")


def test_predictive_term_never_scales_down() -> None:
    history = tuple((1000.0 - 10 * i, 2.0 + 4 * i) for i in range(5))[::-1]
    ctx = context(ready("a", waiting=0, running=2), ready("b"), demand_history=history)
    assert guard(ctx, 2, predictive=True).target == 2


def test_demand_trend_is_not_tilted_by_one_burst() -> None:
    flat = tuple((10.0 * i, 20.0) for i in range(15))
    burst = (*flat[:-1], (140.0, 200.0))
    assert demand_trend(burst) == pytest.approx(0.0)


# Cold start 30 s (the builder's), ticks every 5 s: a window of seven samples, demand now 40.
def _history(values: list[float], now: float = 1000.0) -> tuple[tuple[float, float], ...]:
    return tuple((now - 5.0 * (len(values) - 1 - i), v) for i, v in enumerate(values))


@pytest.mark.parametrize(
    ("case", "history", "target"),
    [
        ("a burst in the last tick: no trend", _history([20, 20, 20, 20, 20, 20, 40]), 2),
        ("a rise sustained over the window: ahead of it", _history([10, 15, 20, 25, 30, 35, 40]), 4),
        ("a rise over less than the window: not yet", _history([30, 35, 40]), 2),
        ("a dip after a busy stretch is no growth", _history([200, 200, 200, 200, 200, 200, 40]), 2),
    ],
)
def test_predictive_term_acts_on_a_trend_sustained_over_its_window(case: str, history: tuple, target: int) -> None:
    ctx = context(ready("a", waiting=10, running=30), demand_history=history)
    verdict = guard(ctx, 2, predictive=True, interval_s=5.0)
    assert verdict.target == target, (case, verdict.reason)


def test_predictive_term_adds_at_most_its_step() -> None:
    steep = _history([0.1, 5, 10, 20, 30, 35, 40])
    ctx = context(ready("a", waiting=10, running=30), demand_history=steep)
    assert guard(ctx, 2, predictive=True, interval_s=5.0, predictive_max_step=2, max_scale_up_step=8).target == 4
    assert guard(ctx, 2, predictive=True, interval_s=5.0, predictive_max_step=8, max_scale_up_step=8).target > 4


def test_ttft_rule_needs_a_queue_that_lasts_not_one_bursts_backlog() -> None:
    # 10 s ticks, 30 s window: 20 waiting over 3 replicas in one tick is a burst's backlog; in two of three, not.
    def run(waiting: list[float]) -> int:
        state = GuardrailState()
        for i, w in enumerate(waiting):
            ctx = context(ready("a", waiting=w, running=40, ttft=2.0), *FLOOR[1:], now=1000.0 + 10 * i)
            verdict = guard(ctx, 3, state, scale_down_stabilization_s=0)
            state = verdict.state
        return verdict.target

    assert run([0.0, 0.0, 20.0]) == 3
    assert run([0.0, 20.0, 20.0]) == 4


@pytest.mark.parametrize(
    ("case", "history", "node_lead_s", "target", "nodes_for"),
    [
        ("nodes not provisioned ahead", _history([10, 15, 20, 25, 30, 35, 40]), 0.0, 4, None),
        # slope 1/s: 40 + 30 = 70 a cold start ahead (4 replicas), 40 + 150 = 190 a node start more (+2 at most)
        ("a rise: nodes a node start ahead", _history([10, 15, 20, 25, 30, 35, 40]), 120.0, 4, 6),
        ("flat: nodes for the target", _history([40] * 7), 120.0, 2, 2),
        ("a burst: no trend, nodes for the target", _history([20, 20, 20, 20, 20, 20, 40]), 120.0, 2, 2),
    ],
)
def test_nodes_are_provisioned_a_node_start_ahead_of_replicas(
    case: str, history: tuple, node_lead_s: float, target: int, nodes_for: int | None
) -> None:
    ctx = context(ready("a", waiting=10, running=30), demand_history=history, node_lead_s=node_lead_s)
    verdict = guard(ctx, 2, predictive=True, interval_s=5.0)
    assert (verdict.target, verdict.nodes_for) == (target, nodes_for), (case, verdict.reason)
