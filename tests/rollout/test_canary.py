"""The canary state machine: each transition, with an input that trips it."""

from __future__ import annotations

import dataclasses

import pytest

from rollout.canary import CanaryPlan, CanaryState, Observation, Phase, Side, abort, advance, start
from rollout.slis import SliLedger, bucket_quantile

PLAN = CanaryPlan("chat", "qwen-v1", "qwen-v2", steps=(10, 50, 100), bake_s=30.0, min_samples=20, tolerance=0.10)
GOOD = Side(requests=200, errors=0, ttft_p99_s=0.100, tpot_p99_s=0.020)


def side(**changes: float | int | None) -> Side:
    return dataclasses.replace(GOOD, **changes)


def baking(step: int = 0, at: float = 100.0) -> CanaryState:
    state, _ = start(PLAN, at)
    return dataclasses.replace(state, step=step)


def test_start_puts_the_candidate_at_the_first_step() -> None:
    state, decision = start(PLAN, 100.0)
    assert state.phase is Phase.BAKING and state.weight == 10
    assert state.weights == {"qwen-v1": 90, "qwen-v2": 10}
    assert (decision.action, decision.weight_from, decision.weight_to) == ("start", 0, 10)


def test_it_holds_while_the_bake_is_not_over() -> None:
    state, decision = advance(baking(), Observation(GOOD, GOOD), 129.0)
    assert decision.action == "hold" and state.weight == 10
    assert "29 s of 30 s" in decision.reason


def test_it_holds_past_the_bake_while_a_side_has_too_few_requests() -> None:
    state, decision = advance(baking(), Observation(GOOD, side(requests=19)), 200.0)
    assert decision.action == "hold" and state.weight == 10
    assert "too few requests" in decision.reason and "qwen-v2 19 of 20" in decision.reason


def test_a_baked_step_with_enough_samples_and_nothing_worse_steps_up() -> None:
    within = side(ttft_p99_s=0.109, tpot_p99_s=0.0219, errors=0)
    state, decision = advance(baking(), Observation(GOOD, within), 130.0)
    assert (decision.action, decision.weight_from, decision.weight_to) == ("step", 10, 50)
    assert state.step == 1 and state.step_started_at == 130.0 and state.weights == {"qwen-v1": 50, "qwen-v2": 50}


def test_passing_the_step_before_100_promotes() -> None:
    state, decision = advance(baking(step=1), Observation(GOOD, GOOD), 130.0)
    assert (decision.action, decision.weight_to) == ("promote", 100)
    assert state.phase is Phase.PROMOTED and not state.active
    assert state.weights == {"qwen-v1": 0, "qwen-v2": 100}


@pytest.mark.parametrize(
    ("candidate", "metric", "values"),
    [
        (side(ttft_p99_s=0.111), "TTFT p99", "111.0 ms on qwen-v2 against 100.0 ms on qwen-v1"),
        (side(tpot_p99_s=0.040), "TPOT p99", "40.0 ms on qwen-v2 against 20.0 ms on qwen-v1"),
        (side(errors=40), "error rate", "20.00% on qwen-v2 against 0.00% on qwen-v1"),
    ],
)
def test_a_metric_worse_beyond_the_tolerance_rolls_back_naming_it_and_both_values(
    candidate: Side, metric: str, values: str
) -> None:
    # Before the bake is over: enough samples already show it.
    state, decision = advance(baking(step=1), Observation(GOOD, candidate), 110.0)
    assert (decision.action, decision.weight_from, decision.weight_to) == ("rollback", 50, 0)
    assert state.phase is Phase.ROLLED_BACK and state.weights == {"qwen-v1": 100, "qwen-v2": 0}
    assert f"{metric} {values}" in decision.reason
    assert [d.metric for d in decision.deltas if d.worse] == [metric]


def test_a_plan_judged_on_the_error_rate_alone_steps_past_a_slower_candidate_and_rolls_back_a_failing_one() -> None:
    plan = dataclasses.replace(PLAN, metrics=("error rate",))
    state = dataclasses.replace(start(plan, 100.0)[0], step=0)
    _, slower = advance(state, Observation(GOOD, side(ttft_p99_s=0.300, tpot_p99_s=0.060)), 130.0)
    assert slower.action == "step" and [d.metric for d in slower.deltas] == ["error rate"]
    _, failing = advance(state, Observation(GOOD, side(errors=40)), 110.0)
    assert failing.action == "rollback" and "error rate 20.00%" in failing.reason


def test_a_worse_candidate_with_too_few_samples_is_not_judged_yet() -> None:
    _, decision = advance(baking(), Observation(GOOD, side(requests=10, errors=5)), 110.0)
    assert decision.action == "hold"


def test_a_finished_rollout_only_holds_and_cannot_be_aborted() -> None:
    promoted, _ = advance(baking(step=1), Observation(GOOD, GOOD), 130.0)
    again, decision = advance(promoted, Observation(GOOD, side(errors=200)), 200.0)
    assert decision.action == "hold" and again == promoted
    with pytest.raises(ValueError, match="finished"):
        abort(promoted, 200.0)


def test_abort_takes_the_candidate_back_to_zero() -> None:
    state, decision = abort(baking(step=1), 120.0)
    assert state.phase is Phase.ABORTED and state.weight == 0
    assert (decision.action, decision.weight_from, decision.weight_to) == ("abort", 50, 0)


@pytest.mark.parametrize(
    "changes",
    [
        {"steps": (10, 50)},
        {"steps": (50, 10, 100)},
        {"steps": (100,)},
        {"bake_s": 0.0},
        {"candidate": "qwen-v1"},
        {"metrics": ()},
        {"metrics": ("TTFT p50",)},
    ],  # fmt: skip
)
def test_a_plan_that_cannot_run_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(PLAN, **changes)


def test_bucket_quantile_interpolates_inside_the_bucket_it_falls_in() -> None:
    edges = (0.1, 0.2, 0.4)
    assert bucket_quantile([0, 100, 0, 0], 0.99, edges) == pytest.approx(0.199)
    assert bucket_quantile([50, 0, 50, 0], 0.5, edges) == pytest.approx(0.1)
    assert bucket_quantile([0, 0, 0, 7], 0.99, edges) == 0.4  # above the last edge: read as it
    assert bucket_quantile([0, 0, 0, 0], 0.99, edges) is None


def test_the_ledger_sums_a_pools_reports_inside_the_window_only() -> None:
    from fleet.protocol.wire import LATENCY_EDGES_S, PoolOutcomes

    ttft = [0] * (len(LATENCY_EDGES_S) + 1)
    ttft[LATENCY_EDGES_S.index(0.1)] = 10
    ledger = SliLedger()
    ledger.record("qwen-v2", PoolOutcomes(ok=5, errors=5, ttft=ttft), now=10.0)
    ledger.record("qwen-v2", PoolOutcomes(ok=8, client_errors=2), now=20.0)
    ledger.record("qwen-v1", PoolOutcomes(ok=100), now=20.0)
    assert ledger.window("qwen-v2", since=15.0) == Side(10, 0, None, None)
    whole = ledger.window("qwen-v2", since=0.0)
    assert (whole.requests, whole.errors, whole.error_rate) == (20, 5, 0.25)
    assert whole.ttft_p99_s is not None and 0.075 < whole.ttft_p99_s <= 0.1
    ledger.trim(before=15.0)
    assert ledger.window("qwen-v2", since=0.0).requests == 10
