"""Role split: how many of a paid budget of replicas prefill and how many decode, a pure function of a context.

Type: ``split_roles`` (a policy in R4's shape: a frozen context in, a value out, no clock, no I/O).

What it does. Dynamo's planner (../shared/research/pd_disaggregation.md, section 2.2) sizes prefill workers from
prefill throughput at the TTFT target and decode workers from decode throughput at the inter-token target
(`fleet.capacity.disagg_plan.size_roles` computes both counts, ``P`` and ``D``, for a traffic mix) and, when
``P + D`` exceeds its GPU budget, scales both down in proportion. At equal paid GPU-hours against an aggregated pool
of ``N`` replicas the budget is ``N`` and every replica of it is paid whether busy or not, so the split spends all of
it in the same proportion, both roles at the same utilisation (the research file's section 3: "choose P:D so both
pools run at the same utilisation", Dynamo's formula with its adjustment interval cancelled)::

    prefill = clamp(round(N * P / (P + D)), lo, hi)        decode = N - prefill
    lo = prefill_min (at least 1 when P > 0)                hi = min(prefill_max, N - decode_min)

``prefill_min`` / ``prefill_max`` are the stack's ``disaggregation.prefill.replicas`` where the pool sets it (the
scaler keeps the prefill role within them), else ``1`` and ``N - decode_min``. A budget too small for both bounds
keeps ``decode_min`` decode replicas: a pool that cannot decode answers nothing.

Inputs consumed: each role's count at its target, the budget, the bounds. Parameters: none.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.capacity.disagg import DEFAULT_THRESHOLD_TOKENS
from fleet.spec.stack import PoolSpec

__all__ = ["RoleSplit", "SplitContext", "prefill_bounds", "split_roles", "stack_threshold"]


@dataclass(frozen=True)
class SplitContext:
    # demand: each role's replicas at its own target (`fleet.capacity.disagg_plan.size_roles`)
    prefill_needed: int  # from the TTFT target
    decode_needed: int  # from the inter-token target
    # budget: replicas paid for in all (the aggregated pool's count, for equal paid GPU-hours)
    budget: int
    # bounds: the stack's `disaggregation.prefill.replicas` where set
    prefill_min: int = 1
    prefill_max: int | None = None
    decode_min: int = 1


@dataclass(frozen=True)
class RoleSplit:
    prefill: int
    decode: int
    bounded: bool  # a bound, not the targets' proportion, set the prefill count


def split_roles(ctx: SplitContext) -> RoleSplit:
    """The budget split in the proportion the two targets ask for, within the bounds (module docstring)."""
    if ctx.budget < 1:
        raise ValueError(f"a split needs a budget of 1 replica or more, got {ctx.budget}")
    needed = ctx.prefill_needed + ctx.decode_needed
    share = ctx.prefill_needed / needed if needed > 0 else 0.5
    wanted = round(ctx.budget * share)
    low = ctx.prefill_min if ctx.prefill_needed <= 0 else max(1, ctx.prefill_min)
    high = ctx.budget - min(ctx.decode_min, ctx.budget)
    if ctx.prefill_max is not None:
        high = min(high, ctx.prefill_max)
    prefill = max(0, min(high, max(low, wanted)))
    return RoleSplit(prefill, ctx.budget - prefill, prefill != wanted)


def stack_threshold(pool: PoolSpec) -> int:
    """The pool's ``disaggregation.thresholdTokens``, else older Dynamo's default (1000)."""
    pd = pool.disaggregation
    return DEFAULT_THRESHOLD_TOKENS if pd is None else pd.threshold_tokens


def prefill_bounds(pool: PoolSpec) -> tuple[int, int | None]:
    """The pool's ``disaggregation.prefill.replicas`` (min, max), else (1, None): at least one, at most the budget
    less the decode replicas."""
    pd = pool.disaggregation
    return (1, None) if pd is None else (pd.prefill.replicas.min, pd.prefill.replicas.max)
