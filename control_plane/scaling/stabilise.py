"""Bounds, the paid floor, stabilisation, step limits and the replica target: where the guarded number may go
and how fast it may move capacity.

A scale-up waits ``scaleUpStabilizationS`` (default 0: fast) of continuous "want more"; a scale-down waits
``scaleDownStabilizationS`` of continuous "want less" and then goes to the highest count recommended inside that
window. ``maxScaleUpStep`` / ``maxScaleDownStep`` then limit one tick's change. The counters (first-seen times
and recent recommendations) are the one hysteresis every policy shares, carried in `GuardrailState`.

The result is translated back to a replica target: stale or failed replicas stay in ``current`` but not in
capacity, so a pool with a dead replica grows to replace it.
"""

from __future__ import annotations

from dataclasses import replace

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.draft import Draft
from fleet.spec.stack import AutoscalingSpec

__all__ = ["bounds", "fill_paid", "stabilise", "step_limits", "to_target", "yield_paid"]


def bounds(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 4: the desired count inside ``[min, max]``."""
    del cfg  # Unused.
    if draft.desired > ctx.max_replicas:
        return replace(draft, desired=ctx.max_replicas, reason=f"{draft.reason}; capped at max {ctx.max_replicas}")
    if draft.desired < ctx.min_replicas:
        return replace(draft, desired=ctx.min_replicas)
    return draft


def fill_paid(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 5: the desired count at least the paid floor (``ctx.paid_floor``: the replicas the GPUs its node group
    always pays for hold, at most ``max``), so those GPUs serve instead of idling; nothing where there is none."""
    del cfg  # Unused.
    if ctx.paid_gpus:  # what the pool wants on its own: a shared group splits its paid GPUs by it next tick
        draft = draft.note("want", draft.desired)
    floor = min(ctx.paid_floor, ctx.max_replicas)  # a rollout may size a pool below the stack's max
    if draft.desired >= floor:
        return draft
    reason = f"filling paid nodes: {ctx.paid_gpus} GPUs paid hold {floor} replicas; {draft.reason}"
    return replace(draft.note("paid_floor", floor), desired=floor, reason=reason)


def stabilise(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 6: the capacity to run once "want more" or "want less" has lasted its window (module docstring)."""
    now, desired, capacity, state = ctx.now, draft.desired, ctx.capacity, draft.state
    window = max(cfg.scale_down_stabilization_s, cfg.scale_up_stabilization_s)
    recs = (*((t, d) for t, d in state.recommendations if now - t <= window), (now, desired))
    state = replace(state, recommendations=recs)
    if desired > capacity:
        since = now if state.above_since is None else state.above_since
        draft = replace(draft, state=replace(state, above_since=since, below_since=None))
        if now - since < cfg.scale_up_stabilization_s:
            left = cfg.scale_up_stabilization_s - (now - since)
            return replace(draft, reason=f"{draft.reason}; scale-up waits {left:.0f}s more")
        in_window = [d for t, d in recs if now - t <= cfg.scale_up_stabilization_s]
        return replace(draft, capacity=max(capacity, min(in_window)))
    if desired < capacity:
        since = now if state.below_since is None else state.below_since
        draft = replace(draft, state=replace(state, above_since=None, below_since=since))
        waited = now - since
        if waited < cfg.scale_down_stabilization_s:
            left = cfg.scale_down_stabilization_s - waited
            return replace(draft, reason=f"{draft.reason}; stabilising: scale-down waits {left:.0f}s more")
        in_window = [d for t, d in recs if now - t <= cfg.scale_down_stabilization_s]
        reason = f"{draft.reason}; low for {waited:.0f}s >= {cfg.scale_down_stabilization_s:g}s window"
        return replace(draft, capacity=min(capacity, max(in_window)), reason=reason)
    return replace(draft, state=replace(state, above_since=None, below_since=None))


def yield_paid(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 6b: on a shared node group, capacity at most ``ctx.paid_cap`` (set while another pool wants the paid
    GPUs this pool holds beyond its share: `fleet.capacity.paid_floor.moving_floors`), at once: the GPU moves to
    the pool that wants it, and the stabilisation window, which keeps capacity against this pool's own dips, does
    not hold it. The cap is never under the pool's own want, so an SLO rule that blocks shrinking blocks this."""
    del cfg  # Unused.
    cap = ctx.paid_cap
    if cap is None or draft.no_shrink:
        return draft
    capacity = max(cap, draft.desired)
    if draft.capacity <= capacity:
        return draft
    reason = f"{draft.reason}; yielding paid GPUs to the group's other pools: capacity {capacity}"
    return replace(draft.note("paid_cap", cap), capacity=capacity, reason=reason)


def step_limits(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 7: one tick changes capacity by at most ``maxScaleUpStep`` / ``maxScaleDownStep``."""
    capacity = ctx.capacity
    if draft.capacity > capacity + cfg.max_scale_up_step:
        reason = f"{draft.reason}; step limited to +{cfg.max_scale_up_step}"
        return replace(draft, capacity=capacity + cfg.max_scale_up_step, reason=reason)
    if draft.capacity < capacity - cfg.max_scale_down_step:
        reason = f"{draft.reason}; step limited to -{cfg.max_scale_down_step}"
        return replace(draft, capacity=capacity - cfg.max_scale_down_step, reason=reason)
    return draft


def to_target(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 8: the capacity as a replica target (replicas that serve nothing stay in ``current``)."""
    del cfg  # Unused.
    target = max(0, ctx.current + (draft.capacity - ctx.capacity))
    target = min(target, max(ctx.max_replicas, ctx.current))
    return replace(draft.note("desired", draft.desired), target=target)
