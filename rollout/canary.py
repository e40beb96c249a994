"""Canary: a rollout of an alias from its baseline pool to a candidate pool, step by step, as a pure state machine.

    start(plan, now) -> state                  candidate at plan.steps[0] percent of the alias
    advance(state, observation, now) -> (state, decision)
    abort(state, now) -> (state, decision)     candidate back to 0

The observation is both sides' SLIs over the same window: the bake window of the current step (since the step's
weight was set). Each call decides one of:

* **rollback** as soon as both sides have ``min_samples`` requests in the window and any judged metric
  (``plan.metrics``: TTFT p99, TPOT p99, the error rate) is worse on the candidate than on the baseline beyond
  ``tolerance`` (`rollout.compare.compare`): the candidate's weight goes back to 0; the reason names the metric
  and both values. It does not wait for the bake to end: a bad candidate serves as few users as its samples need.
* **hold** while the bake is not over, or while either side has fewer than ``min_samples`` requests (a quiet
  alias never steps up on no evidence);
* **step** to the next weight once the bake is over with enough samples and nothing worse;
* **promote** when the next weight is 100: the candidate takes the whole alias, the baseline goes to 0 (and is
  then drained and scaled to ``replicas.min`` or 0, ``baseline_after``). The 100% step is not baked: with the
  baseline at 0 there is nothing left to compare against.

Nothing here performs I/O or reads a clock; the control loop feeds observations and carries the state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Literal

from rollout.compare import Delta, Figures, compare

__all__ = [
    "CANARY_METRICS",
    "METRIC_NAMES",
    "Action",
    "CanaryDecision",
    "CanaryPlan",
    "CanaryState",
    "Observation",
    "Phase",
    "Side",
    "abort",
    "advance",
    "start",
]

CANARY_METRICS = ("TTFT p99", "TPOT p99", "error rate")  # `rollout.compare` names; throughput needs a sweep
# the stack's names for them (aliases.<name>.rollout.metrics)
METRIC_NAMES = {"ttftP99": "TTFT p99", "tpotP99": "TPOT p99", "errorRate": "error rate"}

Action = Literal["start", "hold", "step", "promote", "rollback", "abort"]


class Phase(enum.StrEnum):
    BAKING = "baking"  # a step's weight is set and its window is being observed
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled-back"
    ABORTED = "aborted"


@dataclass(frozen=True)
class CanaryPlan:
    """One rollout: ``alias`` from ``baseline`` to ``candidate`` through ``steps`` (candidate percent, increasing,
    ending at 100), each baked ``bake_s`` with at least ``min_samples`` requests on each side. ValueError when any
    of that does not hold."""

    alias: str
    baseline: str
    candidate: str
    steps: tuple[int, ...] = (1, 5, 25, 50, 100)
    bake_s: float = 300.0
    min_samples: int = 100
    tolerance: float = 0.10
    baseline_after: Literal["zero", "min"] = "zero"  # the baseline's replicas once promoted
    metrics: tuple[str, ...] = CANARY_METRICS  # what a step is judged on: `rollout.compare` names

    def __post_init__(self) -> None:
        steps = self.steps
        if len(steps) < 2 or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps):
            raise ValueError(f"steps must be percents in 1..100 ending at 100, at least two of them; got {steps}")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"steps must increase; got {steps}")
        if self.bake_s <= 0 or self.min_samples < 1 or not 0.0 <= self.tolerance < 1.0:
            raise ValueError("bake_s > 0, min_samples >= 1 and 0 <= tolerance < 1 are required")
        if self.baseline == self.candidate:
            raise ValueError(f"the candidate {self.candidate!r} is the baseline")
        if not self.metrics or not set(self.metrics) <= set(CANARY_METRICS):
            raise ValueError(f"metrics must be some of {', '.join(CANARY_METRICS)}; got {self.metrics}")


@dataclass(frozen=True)
class Side:
    """One pool's SLIs over the window: answers, the 5xx among them, latency p99s (None: none measured)."""

    requests: int = 0
    errors: int = 0
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def figures(self) -> Figures:
        return Figures(None, self.ttft_p99_s, self.tpot_p99_s, self.error_rate, self.requests)


@dataclass(frozen=True)
class Observation:
    """Both sides over the same window (the current step's bake window)."""

    baseline: Side
    candidate: Side


@dataclass(frozen=True)
class CanaryState:
    plan: CanaryPlan
    phase: Phase
    step: int  # index into plan.steps
    started_at: float
    step_started_at: float  # the current weight's bake window starts here
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.phase is Phase.BAKING

    @property
    def weight(self) -> int:
        """The candidate's percent of the alias now."""
        if self.phase is Phase.PROMOTED:
            return 100
        return self.plan.steps[self.step] if self.phase is Phase.BAKING else 0

    @property
    def weights(self) -> dict[str, int]:
        """The alias's weights now: the baseline has the rest."""
        return {self.plan.baseline: 100 - self.weight, self.plan.candidate: self.weight}


@dataclass(frozen=True)
class CanaryDecision:
    action: Action
    weight_from: int  # the candidate's percent before and after
    weight_to: int
    reason: str
    deltas: tuple[Delta, ...] = field(default_factory=tuple)


def start(plan: CanaryPlan, now: float) -> tuple[CanaryState, CanaryDecision]:
    """The rollout's first step: the candidate at ``plan.steps[0]`` percent."""
    state = CanaryState(plan, Phase.BAKING, 0, now, now, f"step 1 of {len(plan.steps)}: baking")
    reason = (
        f"rollout of {plan.alias} from {plan.baseline} to {plan.candidate} started: candidate at "
        f"{plan.steps[0]}% (steps {', '.join(map(str, plan.steps))}; bake {plan.bake_s:g} s, at least "
        f"{plan.min_samples} requests a side, tolerance {plan.tolerance:.0%} on {', '.join(plan.metrics)})"
    )
    return state, CanaryDecision("start", 0, state.weight, reason)


def _value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2%}" if metric == "error rate" else f"{value * 1000:.1f} ms"


def advance(state: CanaryState, observation: Observation, now: float) -> tuple[CanaryState, CanaryDecision]:
    """One tick of an active rollout (see the module docstring); a finished one only holds."""
    plan, weight = state.plan, state.weight
    if not state.active:
        return state, CanaryDecision("hold", weight, weight, f"rollout {state.phase}: {state.reason}")
    base, cand = observation.baseline, observation.candidate
    baked = now - state.step_started_at
    enough = base.requests >= plan.min_samples and cand.requests >= plan.min_samples
    deltas: tuple[Delta, ...] = ()
    if enough:
        verdict = compare(base.figures(), cand.figures(), plan.tolerance, metrics=plan.metrics)
        deltas = verdict.deltas
        worse = [d for d in deltas if d.worse]
        if worse:
            what = "; ".join(
                f"{d.metric} {_value(d.candidate, d.metric)} on {plan.candidate} against "
                f"{_value(d.baseline, d.metric)} on {plan.baseline}"
                for d in worse
            )
            reason = (
                f"rolled back at {weight}%: {what} (worse by more than {plan.tolerance:.0%}; "
                f"{cand.requests} and {base.requests} requests over {baked:.0f} s)"
            )
            rolled = replace(state, phase=Phase.ROLLED_BACK, step_started_at=now, reason=reason)
            return rolled, CanaryDecision("rollback", weight, 0, reason, deltas)
    if baked < plan.bake_s:
        reason = f"baking {weight}%: {baked:.0f} s of {plan.bake_s:g} s"
        return replace(state, reason=reason), CanaryDecision("hold", weight, weight, reason, deltas)
    if not enough:
        short = ", ".join(
            f"{name} {side.requests} of {plan.min_samples}"
            for name, side in ((plan.candidate, cand), (plan.baseline, base))
            if side.requests < plan.min_samples
        )
        reason = f"holding {weight}%: too few requests in the {baked:.0f} s window ({short})"
        return replace(state, reason=reason), CanaryDecision("hold", weight, weight, reason, deltas)
    figures = ", ".join(f"{d.metric} {_value(d.candidate, d.metric)} vs {_value(d.baseline, d.metric)}" for d in deltas)
    nxt = state.step + 1
    if plan.steps[nxt] == 100:
        reason = f"promoted: {plan.candidate} takes all of {plan.alias} after {weight}% held ({figures})"
        promoted = replace(state, phase=Phase.PROMOTED, step=nxt, step_started_at=now, reason=reason)
        return promoted, CanaryDecision("promote", weight, 100, reason, deltas)
    reason = f"step {nxt + 1} of {len(plan.steps)}: {weight}% -> {plan.steps[nxt]}% ({figures})"
    stepped = replace(state, step=nxt, step_started_at=now, reason=reason)
    return stepped, CanaryDecision("step", weight, plan.steps[nxt], reason, deltas)


def abort(state: CanaryState, now: float, why: str = "aborted by an operator") -> tuple[CanaryState, CanaryDecision]:
    """Stop an active rollout: the candidate back to 0. ValueError when it has finished already."""
    if not state.active:
        raise ValueError(f"the rollout of {state.plan.alias} has finished ({state.phase}); nothing to abort")
    weight = state.weight
    reason = f"{why} at {weight}%: {state.plan.candidate} back to 0"
    aborted = replace(state, phase=Phase.ABORTED, step_started_at=now, reason=reason)
    return aborted, CanaryDecision("abort", weight, 0, reason)
