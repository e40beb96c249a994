"""Compare: a candidate's service-level figures against its baseline's, metric by metric, within a tolerance.

Pure and shared by the capacity-regression gate (``llmfleet gate``: two replicas under the same load) and canary
rollouts (canary and baseline pools over the same window). Each metric knows which way is worse: throughput
worse when lower, latencies and the error rate worse when higher. A metric fails when the candidate is worse by
more than ``tolerance`` of the baseline's value; the error rate, whose baseline is often 0, also fails when the
candidate's exceeds the baseline's by more than ``error_rate_slack`` (absolute), so 0 -> 0.1% is not an infinite
regression and 0 -> 5% is still caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Delta", "Figures", "Verdict", "compare"]


@dataclass(frozen=True)
class Figures:
    """One side's figures. ``None``: not measured (too few samples), which never passes or fails by itself."""

    throughput_rps: float | None  # requests/s sustained with TTFT p99 within the SLO
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    error_rate: float | None
    samples: int


# name, attribute, higher is better
_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("throughput at the TTFT SLO", "throughput_rps", True),
    ("TTFT p99", "ttft_p99_s", False),
    ("TPOT p99", "tpot_p99_s", False),
    ("error rate", "error_rate", False),
)


@dataclass(frozen=True)
class Delta:
    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None  # (candidate - baseline) / baseline; None when either side is missing or baseline is 0
    worse: bool  # beyond the tolerance, in the metric's bad direction


@dataclass(frozen=True)
class Verdict:
    deltas: tuple[Delta, ...]

    @property
    def passed(self) -> bool:
        return not any(d.worse for d in self.deltas)

    @property
    def failed_metrics(self) -> list[str]:
        return [d.metric for d in self.deltas if d.worse]


def compare(
    baseline: Figures,
    candidate: Figures,
    tolerance: float,
    *,
    error_rate_slack: float = 0.001,
    metrics: Sequence[str] | None = None,
) -> Verdict:
    """Each metric (all, or those named in ``metrics``): candidate against baseline, worse by more than
    ``tolerance`` (a fraction of the baseline) fails."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    deltas = []
    for name, attr, higher_is_better in _METRICS:
        if metrics is not None and name not in metrics:
            continue
        base, cand = getattr(baseline, attr), getattr(candidate, attr)
        change = None if base is None or cand is None or base == 0 else (cand - base) / base
        worse = False
        if base is not None and cand is not None:
            if higher_is_better:
                worse = cand < base * (1.0 - tolerance)
            elif attr == "error_rate":
                worse = cand > base * (1.0 + tolerance) + error_rate_slack
            else:
                worse = cand > base * (1.0 + tolerance)
        deltas.append(Delta(name, base, cand, change, worse))
    return Verdict(tuple(deltas))
