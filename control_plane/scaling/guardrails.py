"""Guard-rails: the one wrapper applied to every policy's proposal before it becomes a decision.

Order (each step sees the previous one's number; the first that binds is named in the reason):

1. round the proposal up;
2. predictive term (``autoscaling.predictive``): project demand over the cold-start horizon from its trend
   and raise the proposal by the same factor, by at most ``predictiveMaxStep`` replicas (never lowers it). The
   trend is the Theil-Sen slope (the median of the pairwise slopes) of the demand samples of the last
   ``predictiveFitS`` (default a cold start), projected from the fitted line's value now, and only once the
   samples cover that window: a burst of a tick or two moves neither the median slope nor the line, and a
   trend of three ticks at start-up is not stretched over a cold start. A least-squares fit over the window
   read each ten-second burst of the Azure code trace as a trend and projected it to the pool's maximum. It
   scales the load's own need (``Proposal.live``), never capacity a policy holds on purpose (target tracking's
   release envelope);
3. SLO priority, availability > TTFT > throughput. Availability: capacity below ``min`` is restored at once;
   while any replica is stale, failed or without metrics the pool never shrinks (its load is unknown, never
   zero), nor while a gateway's reports are stale (its queue is unknown). TTFT: P99 above the SLO adds one
   replica while requests wait (a median over the last ``ttftQueueWindowS``, default a cold start, of at
   least ``ttftQueuePerReplica`` per ready replica, engines and gateways), unless capacity is already arriving
   (cold start), and P99 within 80% of the SLO blocks shrinking, on the same queueing evidence. Without it the
   misses are prompts whose prefill alone exceeds the SLO (the TTFT floor: 16% of the Azure code trace's
   requests) or a burst's own backlog, gone before a replica launched now serves; acting on them added a
   replica per cold start and never let the pool shrink. Throughput: the policy's own number. A lower
   priority can never undo a higher one, so two triggers never act against each other;
4. bounds ``[min, max]``;
5. stabilisation: a scale-up waits ``scaleUpStabilizationS`` (default 0: fast) of continuous "want more", a
   scale-down waits ``scaleDownStabilizationS`` of continuous "want less" and then goes to the highest count
   recommended inside that window;
6. step limits ``maxScaleUpStep`` / ``maxScaleDownStep``;
7. nodes ahead: a pool whose replicas may need a new GPU node (``node_lead_s``, its group's
   ``nodeColdStartSeconds``) also gets ``nodes_for``, the replicas its nodes should have room for: the target,
   raised by the same demand trend projected over a node start plus a cold start (by at most
   ``predictiveMaxStep``). A replica that needs a new node serves after both starts, so the node must be asked
   for that much earlier; the replica itself is still launched on the cold-start horizon.

Capacity (fresh ready + arriving replicas) is what the proposal is compared against; replicas still starting
count as capacity on its way, so a burst during a cold start does not launch a second wave. The result is
translated back to a replica target: stale or failed replicas stay in ``current`` but not in capacity, so a
pool with a dead replica grows to replace it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.policies import Proposal
from fleet.spec.stack import AutoscalingSpec

__all__ = ["Verdict", "apply_guardrails", "demand_trend"]

_EPS = 1e-9  # proposals like 2.0000000001 from float sums must not round up to 3


@dataclass(frozen=True)
class Verdict:
    """The guarded answer: ``target`` replicas for the pool (what the actuator should run), and why."""

    target: int
    capacity_target: int
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    nodes_for: int | None = None  # replicas to provision nodes for (step 7)


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def demand_trend(history: tuple[tuple[float, float], ...]) -> float:
    """Theil-Sen slope (per second) of ``(t, demand)`` samples: the median of the slopes between every two
    samples, so a minority of outliers (bursts) does not tilt it; 0.0 with fewer than 3 samples."""
    if len(history) < 3:
        return 0.0
    slopes = [(v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(history) for t2, v2 in history[i + 1 :] if t2 != t1]
    return _median(slopes) if slopes else 0.0


def _projection(
    ctx: ScalingContext, cfg: AutoscalingSpec, horizon_s: float | None = None
) -> tuple[float, float] | None:
    """The trend line's demand now and ``horizon_s`` (default a cold start) ahead, fitted over the last
    ``predictiveFitS``; None until the samples cover that window (less one tick: they are taken once a tick)."""
    fit_s = cfg.predictive_fit_s or ctx.cold_start_s
    samples = tuple((t, v) for t, v in ctx.demand_history if ctx.now - t <= fit_s)
    if not samples or ctx.now - samples[0][0] < fit_s - cfg.interval_s:
        return None
    slope = demand_trend(samples)
    level = _median([v + slope * (ctx.now - t) for t, v in samples])  # the fitted line's value now
    return level, level + slope * (ctx.cold_start_s if horizon_s is None else horizon_s)


def _nodes_ahead(ctx: ScalingContext, cfg: AutoscalingSpec, proposal: Proposal, target: int) -> int | None:
    """Replicas to provision nodes for (step 7): ``target``, raised by the demand trend projected over a node start
    plus a cold start, by at most ``predictiveMaxStep``; None when nodes are not provisioned ahead."""
    if ctx.node_lead_s <= 0:
        return None
    trend = _projection(ctx, cfg, ctx.cold_start_s + ctx.node_lead_s) if cfg.predictive and ctx.demand > 0 else None
    if trend is None or trend[0] <= 0 or trend[1] <= trend[0]:
        return target
    level, projected = trend
    live = proposal.desired if proposal.live is None else proposal.live
    ahead = math.ceil(live * projected / level - _EPS) + (ctx.current - ctx.capacity)  # as a replica target
    return min(max(ctx.max_replicas, ctx.current), max(target, min(ahead, target + cfg.predictive_max_step)))


def _sustained_queue(ctx: ScalingContext, cfg: AutoscalingSpec, state: dict[str, Any]) -> float:
    """The median queue depth of the ticks of the last ``ttftQueueWindowS`` (default a cold start), this one
    included; the samples are carried in ``state["ttft_queues"]``. Ticks without fresh metrics add none."""
    window = ctx.cold_start_s if cfg.ttft_queue_window_s is None else cfg.ttft_queue_window_s
    samples = [(float(t), float(v)) for t, v in state.get("ttft_queues", ()) if ctx.now - t < window]
    if ctx.has_metrics:
        samples.append((ctx.now, ctx.queue_depth))
    state["ttft_queues"] = samples
    return _median([v for _, v in samples]) if samples else 0.0


def apply_guardrails(ctx: ScalingContext, proposal: Proposal, cfg: AutoscalingSpec) -> Verdict:
    """Turn ``proposal`` into a bounded, stabilised, SLO-ordered replica target (see module docstring)."""
    state: dict[str, Any] = dict(ctx.state)
    capacity = ctx.capacity
    inputs: dict[str, Any] = {
        "capacity": capacity,
        "current": ctx.current,
        "ready": len(ctx.fresh_ready),
        "arriving": len(ctx.arriving),
        "draining": len(ctx.draining),
        "unknown": [r.replica for r in ctx.unknown],
        "failed": [r.replica for r in ctx.failed],
        "queue_depth": ctx.queue_depth,
        "gateway_waiting": ctx.gateway_waiting,
        "request_rate": None if ctx.request_rate is None else round(ctx.request_rate, 3),
        "gateways_stale": ctx.gateways_stale,
        "per_replica_qps": None if ctx.per_replica_qps is None else round(ctx.per_replica_qps, 3),
        "running": ctx.running,
        "kv_usage_total": round(ctx.kv_usage_total, 4),
        "ttft_p99_s": ctx.ttft_p99_s,
        "ttft_slo_s": ctx.ttft_slo_s,
        "proposal": round(proposal.desired, 4),
        **dict(proposal.inputs),
    }
    desired = max(0, math.ceil(proposal.desired - _EPS))
    reason = proposal.reason

    # 2. predictive term
    trend = _projection(ctx, cfg) if cfg.predictive and ctx.demand > 0 else None
    if trend is not None:
        level, projected = trend
        inputs["projected_demand"] = round(projected, 3)
        # The proposal grows as the trend does; measured from the line, not from this tick's demand, whose
        # dip below the line after a busy stretch would read as growth.
        if projected > ctx.demand and level > 0 and projected > level:
            # The trend scales what this tick's load needs, not capacity the policy holds after a burst: an
            # envelope still holding a burst's replicas, multiplied by the noise of a flat minute's slope, added
            # replicas a minute after a ten-second burst had passed.
            live = proposal.desired if proposal.live is None else proposal.live
            predicted = math.ceil(live * projected / level - _EPS)
            predicted = min(predicted, desired + cfg.predictive_max_step)
            if predicted > desired:
                desired = predicted
                reason = (
                    f"predictive: demand {ctx.demand:g} trending to {projected:.1f} within the "
                    f"{ctx.cold_start_s:g}s cold start; {reason}"
                )

    # 3. SLO priority: availability, then TTFT, then throughput (the policy's number).
    no_shrink: str | None = None
    if capacity < ctx.min_replicas:
        desired = max(desired, ctx.min_replicas)
        reason = f"availability: capacity {capacity} below min {ctx.min_replicas}"
    elif ctx.unknown:
        names = ", ".join(sorted(r.replica for r in ctx.unknown))
        no_shrink = f"availability: load of {names} unknown (stale or no metrics), not counted as capacity"
    elif not ctx.has_metrics and capacity > 0:
        no_shrink = "availability: no fresh metrics; unknown load is not zero load"
    elif ctx.gateways_stale:
        no_shrink = f"availability: {ctx.gateways_stale} gateway report(s) stale; their queue is unknown, not empty"
    ttft = ctx.ttft_p99_s
    # P99 TTFT is read as queueing only while requests wait; otherwise it is the prefill floor (module docstring).
    ready = sum(1 for r in ctx.fresh_ready if r.has_metrics)
    evidence = cfg.ttft_queue_per_replica * max(1, ready)
    waiting = _sustained_queue(ctx, cfg, state)
    queued = cfg.ttft_queue_per_replica == 0 or (waiting > 0 and waiting >= evidence)
    if ttft is not None and ttft > 0.8 * ctx.ttft_slo_s and not queued:
        inputs["ttft_rule"] = f"not queueing: {waiting:g} waiting (median) < {evidence:g}, P99 read as prefill"
    elif ttft is not None and ttft > ctx.ttft_slo_s:
        over = f"ttft: P99 {ttft * 1000:.0f}ms > SLO {ctx.ttft_slo_s * 1000:.0f}ms with {waiting:g} waiting (median)"
        no_shrink = no_shrink or over
        # Add one while requests wait and no capacity is arriving yet (a cold start already under way is the
        # answer); a lagging P99 over an idle pool adds nothing.
        if not ctx.arriving and desired <= capacity and ctx.demand > 0:
            desired = capacity + 1
            reason = f"{over}: add one"
    elif ttft is not None and ttft > 0.8 * ctx.ttft_slo_s and desired < capacity:
        no_shrink = no_shrink or f"ttft: P99 {ttft * 1000:.0f}ms within 20% of the SLO"
    if no_shrink and desired < capacity:
        desired = capacity
        reason = f"{no_shrink}; scale-down blocked"

    # 4. bounds
    if desired > ctx.max_replicas:
        desired, reason = ctx.max_replicas, f"{reason}; capped at max {ctx.max_replicas}"
    elif desired < ctx.min_replicas:
        desired = ctx.min_replicas

    # 5. stabilisation
    window = max(cfg.scale_down_stabilization_s, cfg.scale_up_stabilization_s)
    recs = [(t, d) for t, d in state.get("recommendations", []) if ctx.now - t <= window]
    recs.append((ctx.now, desired))
    state["recommendations"] = recs
    new_capacity = capacity
    if desired > capacity:
        state["below_since"] = None
        since = ctx.now if state.get("above_since") is None else float(state["above_since"])
        state["above_since"] = since
        if ctx.now - since >= cfg.scale_up_stabilization_s:
            in_window = [d for t, d in recs if ctx.now - t <= cfg.scale_up_stabilization_s]
            new_capacity = max(capacity, min(in_window))
        else:
            reason = f"{reason}; scale-up waits {cfg.scale_up_stabilization_s - (ctx.now - since):.0f}s more"
    elif desired < capacity:
        state["above_since"] = None
        since = ctx.now if state.get("below_since") is None else float(state["below_since"])
        state["below_since"] = since
        waited = ctx.now - since
        if waited >= cfg.scale_down_stabilization_s:
            in_window = [d for t, d in recs if ctx.now - t <= cfg.scale_down_stabilization_s]
            new_capacity = min(capacity, max(in_window))
            reason = f"{reason}; low for {waited:.0f}s >= {cfg.scale_down_stabilization_s:g}s window"
        else:
            left = cfg.scale_down_stabilization_s - waited
            reason = f"{reason}; stabilising: scale-down waits {left:.0f}s more"
    else:
        state["above_since"] = state["below_since"] = None

    # 6. step limits
    if new_capacity > capacity + cfg.max_scale_up_step:
        new_capacity = capacity + cfg.max_scale_up_step
        reason = f"{reason}; step limited to +{cfg.max_scale_up_step}"
    elif new_capacity < capacity - cfg.max_scale_down_step:
        new_capacity = capacity - cfg.max_scale_down_step
        reason = f"{reason}; step limited to -{cfg.max_scale_down_step}"

    target = max(0, ctx.current + (new_capacity - capacity))
    target = min(target, max(ctx.max_replicas, ctx.current))
    inputs["desired"] = desired

    # 7. nodes ahead
    nodes_for = _nodes_ahead(ctx, cfg, proposal, target)
    if nodes_for is not None:
        inputs["nodes_for"] = nodes_for
    return Verdict(target, new_capacity, reason, inputs, state, nodes_for)
