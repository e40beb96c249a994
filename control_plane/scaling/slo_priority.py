"""SLO priority: availability > TTFT > throughput, so two triggers never act against each other.

Availability: capacity below ``min`` is restored at once; while a replica that died is being replaced (within a
cold start of its death, `control_plane.scaling.departures`) the pool never shrinks, so the starting replacement is
never scaled in and launched again; nor while any replica is stale, failed or without metrics (its load is unknown,
never zero), nor while a gateway's reports are stale (its queue is unknown). TTFT: P99 above the SLO adds one
replica while requests wait (a median over the last ``ttftQueueWindowS``, default a cold start, of at least
``ttftQueuePerReplica`` per ready replica, engines and gateways), unless capacity is already arriving (cold start),
and P99 within 80% of the SLO blocks shrinking, on the same queueing evidence. Without it the misses are prompts
whose prefill alone exceeds the SLO (the TTFT floor: 16% of the Azure code trace's requests) or a burst's own
backlog, gone before a replica launched now serves; acting on them added a replica per cold start and never let the
pool shrink. Throughput: the policy's own number. A lower priority can never undo a higher one: the first rule that
blocks shrinking is the one named.
"""

from __future__ import annotations

from dataclasses import replace

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.draft import Draft, median
from fleet.spec.stack import AutoscalingSpec

__all__ = ["availability", "block_shrink", "sustained_queue", "ttft"]


def availability(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 3a: restore ``min`` at once, and say why the pool may not shrink while its load is unknown."""
    del cfg  # Unused.
    capacity = ctx.capacity
    if capacity < ctx.min_replicas:
        reason = f"availability: capacity {capacity} below min {ctx.min_replicas}"
        return replace(draft, desired=max(draft.desired, ctx.min_replicas), reason=reason)
    no_shrink = None
    if ctx.replacing:
        names = ", ".join(sorted(ctx.replacing))
        no_shrink = f"availability: replacing {names} (died within a cold start); the replacement is on its way"
    elif ctx.unknown:
        names = ", ".join(sorted(r.replica for r in ctx.unknown))
        no_shrink = f"availability: load of {names} unknown (stale or no metrics), not counted as capacity"
    elif not ctx.has_metrics and capacity > 0:
        no_shrink = "availability: no fresh metrics; unknown load is not zero load"
    elif ctx.gateways_stale:
        no_shrink = f"availability: {ctx.gateways_stale} gateway report(s) stale; their queue is unknown, not empty"
    return replace(draft, no_shrink=no_shrink)


def sustained_queue(
    ctx: ScalingContext, cfg: AutoscalingSpec, samples: tuple[tuple[float, float], ...]
) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The median queue depth of the ticks of the last ``ttftQueueWindowS`` (default a cold start), this one
    included, and the samples to carry; ticks without fresh metrics add none."""
    window = ctx.cold_start_s if cfg.ttft_queue_window_s is None else cfg.ttft_queue_window_s
    kept = [(t, v) for t, v in samples if ctx.now - t < window]
    if ctx.has_metrics:
        kept.append((ctx.now, ctx.queue_depth))
    return (median([v for _, v in kept]) if kept else 0.0), tuple(kept)


def ttft(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 3b: a P99 TTFT over the SLO while requests wait adds one replica; near the SLO it blocks shrinking."""
    waiting, samples = sustained_queue(ctx, cfg, draft.state.ttft_queues)
    draft = replace(draft, state=replace(draft.state, ttft_queues=samples))
    p99, capacity = ctx.ttft_p99_s, ctx.capacity
    # P99 TTFT is read as queueing only while requests wait; otherwise it is the prefill floor (module docstring).
    evidence = cfg.ttft_queue_per_replica * max(1, sum(1 for r in ctx.fresh_ready if r.has_metrics))
    queued = cfg.ttft_queue_per_replica == 0 or (waiting > 0 and waiting >= evidence)
    if p99 is None or p99 <= 0.8 * ctx.ttft_slo_s:
        return draft
    if not queued:
        rule = f"not queueing: {waiting:g} waiting (median) < {evidence:g}, P99 read as prefill"
        return draft.note("ttft_rule", rule)
    if p99 > ctx.ttft_slo_s:
        over = f"ttft: P99 {p99 * 1000:.0f}ms > SLO {ctx.ttft_slo_s * 1000:.0f}ms with {waiting:g} waiting (median)"
        draft = replace(draft, no_shrink=draft.no_shrink or over)
        # Add one while requests wait and no capacity is arriving yet (a cold start already under way is the
        # answer); a lagging P99 over an idle pool adds nothing.
        if not ctx.arriving and draft.desired <= capacity and ctx.demand > 0:
            draft = replace(draft, desired=capacity + 1, reason=f"{over}: add one")
        return draft
    if draft.desired < capacity:
        return replace(draft, no_shrink=draft.no_shrink or f"ttft: P99 {p99 * 1000:.0f}ms within 20% of the SLO")
    return draft


def block_shrink(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 3c: a pool an SLO rule keeps from shrinking holds its capacity."""
    del cfg  # Unused.
    if draft.no_shrink and draft.desired < ctx.capacity:
        return replace(draft, desired=ctx.capacity, reason=f"{draft.no_shrink}; scale-down blocked")
    return draft
