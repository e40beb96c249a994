"""Error budget: how much of each SLO's allowed failure a pool has spent over its budget window (pure).

For one SLO with target ``t`` (availability 0.999, say) over a window of ``W`` seconds:

    counted requests   total = requests in the window - requests inside planned maintenance windows
                       bad   = bad requests in the window - bad requests inside planned maintenance windows
    burn rate          (bad / total) / (1 - t)     1.0 spends the budget exactly by the window's end
    spent              burn rate x covered / W     covered: how much of the window the counts span (<= W)
    remaining          1 - spent                   negative once overspent
    status             ok below 50% spent, intervene from 50%, exhausted from 100%

Planned maintenance windows (a pool's daily restart window, ``restartWindow`` with ``enabled: true``) are taken
out of both sides: a request answered inside one is neither good nor bad, so restarts an operator scheduled do
not spend the budget, and the requests that did succeed then do not dilute the failures outside. A counter
source reports the window's counts and the counts inside those intervals; the subtraction happens here.

When the counts span only part of the window (a control plane that started an hour ago, a Prometheus with
shorter retention), the budget is the window's whole allowance and only the spanned part of it has been
used: burning at 2x for one day of thirty spends 2/30 of it. With the whole window covered, spent equals the
window's burn rate, the usual request-based definition.

SLOs, each from the gateway's request counter and TTFT histogram (``gateway.metrics``):

    availability   bad: 5xx answers, of all answers                         target slo.availability
    ttft           bad: first token later than slo.ttftP99Ms, of answers     target 0.99 (a p99)
                   with a first token (200s)
    error-rate     bad: 5xx answers, of all answers (the series the          target 1 - slo.errorRate
                   error-rate alert rules use)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from fleet.spec.stack import SloSpec

__all__ = [
    "EXHAUSTED",
    "INTERVENE",
    "OK",
    "SLOS",
    "Budget",
    "Observed",
    "SloTally",
    "Status",
    "Tally",
    "allows",
    "compute",
    "overlap_s",
    "pool_budgets",
    "targets",
    "within_threshold",
    "worst",
]

Status = Literal["ok", "intervene", "exhausted"]
OK: Status = "ok"
INTERVENE: Status = "intervene"
EXHAUSTED: Status = "exhausted"
INTERVENE_AT = 0.5  # spent fraction from which an operator should step in
SLOS = ("availability", "ttft", "error-rate")
TTFT_TARGET = 0.99  # the TTFT SLO is a 99th percentile: 99% of first tokens within the threshold


@dataclass(frozen=True)
class Tally:
    """Requests over some span, and how many of them were bad."""

    total: float = 0.0
    bad: float = 0.0

    def __sub__(self, other: Tally) -> Tally:
        # Counters read at slightly different instants can disagree by a request; never go below zero.
        return Tally(max(0.0, self.total - other.total), max(0.0, self.bad - other.bad))

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.total + other.total, self.bad + other.bad)


@dataclass(frozen=True)
class SloTally:
    """One SLO's counts over the whole window, and the part of them inside planned maintenance windows."""

    window: Tally
    excluded: Tally = Tally()


@dataclass(frozen=True)
class Observed:
    """What a source saw for one pool: counts per SLO (keys of `SLOS`), the seconds of the budget window they
    span, and the seconds of planned maintenance inside that span."""

    tallies: Mapping[str, SloTally]
    covered_s: float
    excluded_s: float = 0.0


@dataclass(frozen=True)
class Budget:
    """One SLO's budget over the window (see the module docstring for each figure)."""

    slo: str
    target: float
    window_s: float
    good: float
    bad: float
    total: float
    excluded_requests: float  # answered inside planned maintenance windows, counted on neither side
    excluded_s: float
    covered_s: float
    burn_rate: float
    spent: float
    remaining: float
    status: Status


def targets(slo: SloSpec) -> dict[str, float]:
    """The target success ratio of each SLO of `SLOS`."""
    return {"availability": slo.availability, "ttft": TTFT_TARGET, "error-rate": 1.0 - slo.error_rate}


def compute(slo: str, target: float, window_s: float, tally: SloTally, covered_s: float, excluded_s: float) -> Budget:
    """The budget of one SLO; ``covered_s`` is clamped to ``[0, window_s]``. No requests: nothing spent."""
    if not 0.0 < target < 1.0 or window_s <= 0:
        raise ValueError(f"target must be in (0, 1) and the window positive (got {target}, {window_s})")
    counted = tally.window - tally.excluded
    covered = min(max(covered_s, 0.0), window_s)
    burn = 0.0 if counted.total <= 0 else (counted.bad / counted.total) / (1.0 - target)
    spent = burn * covered / window_s
    # 1 - 0.999 is 0.0010000000000000009 in binary floating point: exactly the allowance must read as spent.
    level = round(spent, 9)
    status = EXHAUSTED if level >= 1.0 else INTERVENE if level >= INTERVENE_AT else OK
    return Budget(
        slo=slo,
        target=target,
        window_s=window_s,
        good=counted.total - counted.bad,
        bad=counted.bad,
        total=counted.total,
        excluded_requests=tally.excluded.total,
        excluded_s=excluded_s,
        covered_s=covered,
        burn_rate=burn,
        spent=spent,
        remaining=1.0 - spent,
        status=status,
    )


def pool_budgets(slo: SloSpec, observed: Observed) -> list[Budget]:
    """Every SLO's budget for a pool, in `SLOS` order; an SLO the source has no counts for has none spent."""
    wanted = targets(slo)
    window_s, empty = slo.budget_window_s, SloTally(Tally())
    return [
        compute(
            name, wanted[name], window_s, observed.tallies.get(name, empty), observed.covered_s, observed.excluded_s
        )
        for name in SLOS
    ]


def worst(budgets: Iterable[Budget]) -> Budget | None:
    """The budget with the most spent (None for none)."""
    return max(budgets, key=lambda b: b.spent, default=None)


def allows(pool: str, slo: SloSpec, budgets: Sequence[Budget], change: str) -> tuple[bool, str]:
    """Whether a risky ``change`` (``restart``, ``rollout``...) may go ahead on ``pool``, and why (or why not).

    Refused while any SLO's budget is exhausted and the pool's ``slo.freezeOnExhaustedBudget`` is on."""
    spent = [b for b in budgets if b.status == EXHAUSTED]
    if not spent:
        top = worst(budgets)
        if top is None:
            return True, f"{change} allowed on {pool}: no budget computed yet"
        return True, f"{change} allowed on {pool}: error budget left (at most {top.spent:.0%} spent, {top.slo})"
    listed = ", ".join(f"{b.slo} {b.spent:.0%} of its {slo.budget_window} budget spent" for b in spent)
    if not slo.freeze_on_exhausted_budget:
        return True, f"{change} allowed on {pool} despite an exhausted error budget ({listed}): freeze is off"
    return False, (
        f"{change} refused on pool {pool!r}: its error budget is exhausted ({listed}); risky changes are frozen "
        "until the budget recovers (slo.freezeOnExhaustedBudget)"
    )


def within_threshold(buckets: Iterable[tuple[float, float]], threshold: float) -> float:
    """How many observations of a cumulative histogram (``(le, count)`` pairs) fell at or below ``threshold``,
    interpolating linearly inside the bucket the threshold cuts, as Prometheus' histogram_quantile does."""
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in sorted(buckets):
        if threshold <= bound:
            if math.isinf(bound):
                return prev_count  # no upper edge to interpolate to: count only what is known to be within
            return prev_count + (count - prev_count) * (threshold - prev_bound) / (bound - prev_bound)
        prev_bound, prev_count = bound, count
    return prev_count


def overlap_s(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end)`` covered by ``intervals`` (disjoint ``(start, end)`` pairs, epoch seconds)."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
