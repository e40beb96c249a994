"""Gate: is a candidate engine (a new model, engine version or GPU) at least as good as its baseline?

Runs one replica of each through the same sweep (`rollout.sweep`): offered rates at ``rate_multipliers`` x the
baseline pool's planned per-replica rate (`fleet.capacity.plan`), side by side. From the steps it derives, per side:

* **throughput at the TTFT SLO**: the highest offered rate whose TTFT p99 is within the pool's SLO, interpolated
  linearly between the last step within it and the first beyond it (the top step's rate when all are within,
  0 when none is);
* **TTFT p99 and TPOT p99 at the planned rate** (the step whose multiplier is 1, else the one nearest below);
* **the error rate** over all steps.

`rollout.compare.compare` then fails the candidate on any metric worse than the tolerance (10% by default: the
seed's "throughput and P99 may not degrade by more than 10%").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollout.compare import Figures
from rollout.sweep import Profile, StepResult, Target, client, quantile, run_step

__all__ = ["GatePlan", "SideResult", "figures", "run_gate", "throughput_at_slo"]


@dataclass(frozen=True)
class GatePlan:
    per_replica_rps: float  # the planned rate (engine time) the multipliers scale
    rate_multipliers: tuple[float, ...]
    requests_per_step: int
    ttft_slo_s: float
    time_scale: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class SideResult:
    name: str
    steps: tuple[StepResult, ...]


def throughput_at_slo(points: Sequence[tuple[float, float | None]], slo_s: float) -> float:
    """``points``: (offered rate, TTFT p99) in increasing rate; a step without a p99 (nothing completed) counts as
    beyond the SLO. See the module docstring for the rule."""
    best = 0.0
    prev: tuple[float, float] | None = None
    for rate, p99 in points:
        if p99 is not None and p99 <= slo_s:
            best, prev = rate, (rate, p99)
            continue
        if prev is not None and p99 is not None and p99 > prev[1]:
            prev_rate, prev_p99 = prev
            return prev_rate + (slo_s - prev_p99) / (p99 - prev_p99) * (rate - prev_rate)
        return best
    return best


def figures(steps: Sequence[StepResult], multipliers: Sequence[float], plan: GatePlan) -> Figures:
    points = [(s.rate_rps, quantile(s.ttft_s, 0.99)) for s in steps]
    nominal = max((i for i, m in enumerate(multipliers) if m <= 1.0), default=0, key=lambda i: multipliers[i])
    at = steps[nominal]
    sent = sum(s.sent for s in steps)
    failed = sum(sum(s.errors.values()) for s in steps)
    return Figures(
        throughput_rps=throughput_at_slo(points, plan.ttft_slo_s),
        ttft_p99_s=quantile(at.ttft_s, 0.99),
        tpot_p99_s=quantile(at.tpot_s, 0.99),
        error_rate=failed / sent if sent else None,
        samples=sum(s.ok for s in steps),
    )


async def run_gate(targets: Sequence[Target], profile: Profile, plan: GatePlan) -> list[SideResult]:
    """Every step, every target at once, in increasing rate.

    A step's arrivals start when the previous step's arrivals end, without waiting for its requests to finish:
    the offered load only rises, the way traffic ramps, and the sweep takes the time of its arrivals plus one
    drain rather than one drain per step."""
    pending = []
    async with client() as http:
        for k, multiplier in enumerate(sorted(plan.rate_multipliers)):
            pending.append(
                await run_step(
                    http,
                    targets,
                    profile,
                    plan.per_replica_rps * multiplier,
                    plan.requests_per_step,
                    time_scale=plan.time_scale,
                    seed=plan.seed + k,
                    offset=k * plan.requests_per_step,
                )
            )
        steps = [await step.finished() for step in pending]
    return [SideResult(t.name, tuple(step[t.name] for step in steps)) for t in targets]
