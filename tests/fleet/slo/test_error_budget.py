"""Error budget arithmetic, checked against figures worked out by hand."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from fleet.slo.budget import (
    Observed,
    SloTally,
    Tally,
    allows,
    compute,
    overlap_s,
    pool_budgets,
    within_threshold,
)
from fleet.spec.stack import SloSpec

DAY = 86400.0
MONTH = 30 * DAY


@pytest.mark.parametrize(
    ("name", "target", "tally", "covered_s", "burn", "spent", "status"),
    [
        # 50 bad of 100,000 against 0.1% allowed: half the allowance, burnt over the whole window.
        ("half spent intervenes", 0.999, SloTally(Tally(100_000, 50)), MONTH, 0.5, 0.5, "intervene"),
        ("all spent is exhausted", 0.999, SloTally(Tally(100_000, 100)), MONTH, 1.0, 1.0, "exhausted"),
        ("a fifth spent is ok", 0.999, SloTally(Tally(100_000, 20)), MONTH, 0.2, 0.2, "ok"),
        # 20 bad of 10,000 is 0.2%, twice the allowed rate, for 3 of 30 days: 2 x 3/30 of the budget.
        ("part of the window covered", 0.999, SloTally(Tally(10_000, 20)), 3 * DAY, 2.0, 0.2, "ok"),
        ("half the window at twice the rate", 0.999, SloTally(Tally(10_000, 20)), 15 * DAY, 2.0, 1.0, "exhausted"),
        # 30 bad of 1,000 against 1%: 3x. 28 of those bad and 200 requests fell in a planned window: 2 bad of 800,
        # 0.25%, a quarter of the allowed rate.
        ("without the window", 0.99, SloTally(Tally(1000, 30)), MONTH, 3.0, 3.0, "exhausted"),
        ("with the window excluded", 0.99, SloTally(Tally(1000, 30), Tally(200, 28)), MONTH, 0.25, 0.25, "ok"),
        ("no requests spend nothing", 0.999, SloTally(Tally()), MONTH, 0.0, 0.0, "ok"),
    ],
)
def test_budget_matches_hand_computed_figures(
    name: str, target: float, tally: SloTally, covered_s: float, burn: float, spent: float, status: str
) -> None:
    budget = compute("availability", target, MONTH, tally, covered_s, excluded_s=0.0)
    assert budget.burn_rate == pytest.approx(burn), name
    assert budget.spent == pytest.approx(spent)
    assert budget.remaining == pytest.approx(1.0 - spent)
    assert budget.status == status


def test_excluded_requests_count_on_neither_side() -> None:
    budget = compute("availability", 0.99, MONTH, SloTally(Tally(1000, 30), Tally(200, 28)), MONTH, 7200.0)
    assert (budget.total, budget.bad, budget.good) == (800, 2, 798)
    assert (budget.excluded_requests, budget.excluded_s) == (200, 7200.0)


def test_coverage_beyond_the_window_counts_as_the_window() -> None:
    assert compute("ttft", 0.99, DAY, SloTally(Tally(100, 1)), 5 * DAY, 0.0).spent == pytest.approx(1.0)


def test_a_target_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="target"):
        compute("availability", 1.0, MONTH, SloTally(Tally(1, 0)), MONTH, 0.0)


def test_pool_budgets_use_each_slo_target() -> None:
    slo = SloSpec(availability=0.999, error_rate=0.005, budget_window="30d")
    failures = SloTally(Tally(10_000, 10))  # 0.1%
    slow = SloTally(Tally(9_990, 50))  # 0.5% of first tokens late
    observed = Observed({"availability": failures, "error-rate": failures, "ttft": slow}, covered_s=MONTH)
    by_slo = {b.slo: b for b in pool_budgets(slo, observed)}
    assert by_slo["availability"].spent == pytest.approx(1.0)  # 0.1% of 0.1%
    assert by_slo["error-rate"].spent == pytest.approx(0.2)  # 0.1% of 0.5%
    assert by_slo["ttft"].spent == pytest.approx(0.5005, rel=1e-3)  # 50/9990 of 1%
    assert by_slo["ttft"].target == 0.99


@pytest.mark.parametrize(
    ("threshold", "within"),
    [
        (0.25, 80.0),  # on a bucket edge: that bucket's count
        (0.3, 84.0),  # a fifth of the way through (0.25, 0.5]: 80 + 20 x 0.05/0.25
        (0.1, 32.0),  # inside the first bucket, from zero: 80 x 0.1/0.25
        (2.0, 100.0),  # past the last finite edge: only what is known to be within
    ],
)
def test_within_threshold_interpolates_like_histogram_quantile(threshold: float, within: float) -> None:
    buckets = [(0.25, 80.0), (0.5, 100.0), (math.inf, 110.0)]
    assert within_threshold(buckets, threshold) == pytest.approx(within)


def test_overlap_clips_intervals_to_the_span() -> None:
    assert overlap_s([(0.0, 100.0), (150.0, 300.0), (400.0, 500.0)], 50.0, 200.0) == 100.0


def test_an_exhausted_budget_refuses_risky_changes_and_says_why() -> None:
    slo = SloSpec()
    budgets = [compute("availability", 0.999, MONTH, SloTally(Tally(1000, 5)), MONTH, 0.0)]
    ok, reason = allows("qwen-7b", slo, budgets, "restart")
    assert not ok
    assert "restart refused on pool 'qwen-7b'" in reason and "availability 500% of its 30d budget spent" in reason


def test_the_freeze_switch_lets_changes_through() -> None:
    budgets = [compute("availability", 0.999, MONTH, SloTally(Tally(1000, 5)), MONTH, 0.0)]
    ok, reason = allows("qwen-7b", SloSpec(freeze_on_exhausted_budget=False), budgets, "rollout")
    assert ok and "freeze is off" in reason


def test_budget_left_allows_changes() -> None:
    budgets = [compute("availability", 0.999, MONTH, SloTally(Tally(1000, 0)), MONTH, 0.0)]
    assert allows("qwen-7b", SloSpec(), budgets, "restart")[0]
    assert allows("qwen-7b", SloSpec(), [], "restart") == (True, "restart allowed on qwen-7b: no budget computed yet")


@pytest.mark.parametrize(("text", "seconds"), [("30d", MONTH), ("12h", 43200.0), ("90m", 5400.0)])
def test_budget_window_is_read_in_seconds(text: str, seconds: float) -> None:
    assert SloSpec(budget_window=text).budget_window_s == seconds


@pytest.mark.parametrize("text", ["400d", "30x", "0d", "1.5h", ""])
def test_a_bad_budget_window_is_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="budget_?[wW]indow"):
        SloSpec.model_validate({"budgetWindow": text})
