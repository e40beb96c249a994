"""Predictive guard-rails: raise a proposal along the demand trend, and provision nodes ahead of replicas.

The predictive term (``autoscaling.predictive``) projects demand over the cold-start horizon from its trend and
raises the proposal by the same factor, by at most ``predictiveMaxStep`` replicas (never lowers it). The trend is
the Theil-Sen slope (the median of the pairwise slopes) of the demand samples of the last ``predictiveFitS``
(default a cold start), projected from the fitted line's value now, and only once the samples cover that window:
a burst of a tick or two moves neither the median slope nor the line, and a trend of three ticks at start-up is
not stretched over a cold start. A least-squares fit over the window read each ten-second burst of the Azure code
trace as a trend and projected it to the pool's maximum. It scales the load's own need (``Proposal.live``), never
capacity a policy holds on purpose (target tracking's release envelope).

Nodes ahead: a pool whose replicas may need a new GPU node (``node_lead_s``, its group's ``nodeColdStartSeconds``)
also gets ``nodes_for``, the replicas its nodes should have room for: the target, raised by the same demand trend
projected over a node start plus a cold start (by at most ``predictiveMaxStep``). A replica that needs a new node
serves after both starts, so the node must be asked for that much earlier; the replica itself is still launched
on the cold-start horizon.
"""

from __future__ import annotations

import math
from dataclasses import replace

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.draft import EPS, Draft, median
from fleet.spec.stack import AutoscalingSpec

__all__ = ["demand_trend", "nodes_ahead", "predictive", "projection"]


def demand_trend(history: tuple[tuple[float, float], ...]) -> float:
    """Theil-Sen slope (per second) of ``(t, demand)`` samples: the median of the slopes between every two
    samples, so a minority of outliers (bursts) does not tilt it; 0.0 with fewer than 3 samples."""
    if len(history) < 3:
        return 0.0
    slopes = [(v2 - v1) / (t2 - t1) for i, (t1, v1) in enumerate(history) for t2, v2 in history[i + 1 :] if t2 != t1]
    return median(slopes) if slopes else 0.0


def projection(ctx: ScalingContext, cfg: AutoscalingSpec, horizon_s: float | None = None) -> tuple[float, float] | None:
    """The trend line's demand now and ``horizon_s`` (default a cold start) ahead, fitted over the last
    ``predictiveFitS``; None until the samples cover that window (less one tick: they are taken once a tick)."""
    fit_s = cfg.predictive_fit_s or ctx.cold_start_s
    samples = tuple((t, v) for t, v in ctx.demand_history if ctx.now - t <= fit_s)
    if not samples or ctx.now - samples[0][0] < fit_s - cfg.interval_s:
        return None
    slope = demand_trend(samples)
    level = median([v + slope * (ctx.now - t) for t, v in samples])  # the fitted line's value now
    return level, level + slope * (ctx.cold_start_s if horizon_s is None else horizon_s)


def _live(draft: Draft) -> float:
    """What this tick's load asks for, without capacity the policy holds on purpose."""
    proposal = draft.proposal
    return proposal.desired if proposal.live is None else proposal.live


def predictive(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 2: the proposal raised as the demand trend grows over a cold start (module docstring)."""
    trend = projection(ctx, cfg) if cfg.predictive and ctx.demand > 0 else None
    if trend is None:
        return draft
    level, projected = trend
    draft = draft.note("projected_demand", round(projected, 3))
    # The proposal grows as the trend does; measured from the line, not from this tick's demand, whose dip below
    # the line after a busy stretch would read as growth.
    if not (projected > ctx.demand and level > 0 and projected > level):
        return draft
    # The trend scales what this tick's load needs, not capacity the policy holds after a burst: an envelope
    # still holding a burst's replicas, multiplied by the noise of a flat minute's slope, added replicas a minute
    # after a ten-second burst had passed.
    predicted = min(math.ceil(_live(draft) * projected / level - EPS), draft.desired + cfg.predictive_max_step)
    if predicted <= draft.desired:
        return draft
    reason = (
        f"predictive: demand {ctx.demand:g} trending to {projected:.1f} within the "
        f"{ctx.cold_start_s:g}s cold start; {draft.reason}"
    )
    return replace(draft, desired=predicted, reason=reason)


def nodes_ahead(ctx: ScalingContext, cfg: AutoscalingSpec, draft: Draft) -> Draft:
    """Step 9: the replicas to provision nodes for (module docstring); unset when nodes are not provisioned
    ahead (``node_lead_s`` 0)."""
    if ctx.node_lead_s <= 0:
        return draft
    target = draft.target
    trend = projection(ctx, cfg, ctx.cold_start_s + ctx.node_lead_s) if cfg.predictive and ctx.demand > 0 else None
    if trend is None or trend[0] <= 0 or trend[1] <= trend[0]:
        nodes_for = target
    else:
        level, projected = trend
        ahead = math.ceil(_live(draft) * projected / level - EPS) + (ctx.current - ctx.capacity)  # a replica target
        nodes_for = min(max(ctx.max_replicas, ctx.current), max(target, min(ahead, target + cfg.predictive_max_step)))
    return replace(draft.note("nodes_for", nodes_for), nodes_for=nodes_for)
