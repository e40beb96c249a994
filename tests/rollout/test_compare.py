"""The candidate-against-baseline comparison the gate and canaries share."""

from __future__ import annotations

import pytest

from rollout.compare import Figures, compare
from rollout.gate import throughput_at_slo

BASE = Figures(throughput_rps=20.0, ttft_p99_s=0.200, tpot_p99_s=0.030, error_rate=0.0, samples=500)


def figures(**changes: float | None) -> Figures:
    values = {**BASE.__dict__, **changes}
    return Figures(**values)


def test_an_identical_candidate_passes_every_metric() -> None:
    verdict = compare(BASE, BASE, 0.10)
    assert verdict.passed and verdict.failed_metrics == []
    assert [d.metric for d in verdict.deltas] == ["throughput at the TTFT SLO", "TTFT p99", "TPOT p99", "error rate"]


@pytest.mark.parametrize(
    ("changes", "failed"),
    [
        ({"throughput_rps": 17.9}, ["throughput at the TTFT SLO"]),  # 10.5% lower
        ({"ttft_p99_s": 0.221}, ["TTFT p99"]),  # 10.5% higher
        ({"tpot_p99_s": 0.0332}, ["TPOT p99"]),
        ({"error_rate": 0.0011}, ["error rate"]),  # 0 -> 0.11%: above the 0.1% slack
    ],
)
def test_a_metric_worse_than_the_tolerance_fails_by_name(changes: dict[str, float], failed: list[str]) -> None:
    assert compare(BASE, figures(**changes), 0.10).failed_metrics == failed


def test_changes_within_the_tolerance_or_for_the_better_pass() -> None:
    better = figures(throughput_rps=30.0, ttft_p99_s=0.1, tpot_p99_s=0.02)
    within = figures(throughput_rps=18.1, ttft_p99_s=0.219, tpot_p99_s=0.0329, error_rate=0.0009)
    assert compare(BASE, better, 0.10).passed
    assert compare(BASE, within, 0.10).passed


def test_a_metric_measured_on_one_side_only_neither_passes_nor_fails_it() -> None:
    delta = compare(BASE, figures(ttft_p99_s=None), 0.10).deltas[1]
    assert delta.candidate is None and delta.change is None and not delta.worse


def test_a_tolerance_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        compare(BASE, BASE, 1.5)


def test_throughput_at_the_slo_interpolates_between_the_last_step_within_and_the_first_beyond() -> None:
    # 10 req/s at 100 ms, 20 at 200 ms, 30 at 500 ms; SLO 300 ms: 20 + (300-200)/(500-200) * 10 = 23.33
    assert throughput_at_slo([(10, 0.1), (20, 0.2), (30, 0.5)], 0.3) == pytest.approx(23.333, abs=1e-3)
    assert throughput_at_slo([(10, 0.1), (20, 0.2)], 0.3) == 20  # never beyond: the top step
    assert throughput_at_slo([(10, 0.4), (20, 0.5)], 0.3) == 0  # never within
    assert throughput_at_slo([(10, 0.1), (20, None)], 0.3) == 10  # nothing completed counts as beyond
