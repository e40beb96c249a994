"""Threshold (``threshold``): the baseline rule many stacks ship, "more than 5 waiting adds a replica".

    avg waiting per ready replica > threshold            -> capacity + 1
    nothing waiting and running < idleFraction of slots  -> capacity - 1
    otherwise                                            -> capacity

It reacts one replica at a time and ignores KV usage; it is kept to compare `target-tracking` against.

Parameters: ``threshold`` (default 5), ``idleFraction`` (default 0.25).

    autoscaling:
      policy: {name: threshold, params: {threshold: 5}}
"""

from __future__ import annotations

from pydantic import Field

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.policies import Proposal, ScalingPolicy
from fleet.spec.plugins import PluginParams

__all__ = ["Threshold"]


class Threshold(ScalingPolicy, name="threshold"):
    class Params(PluginParams):
        threshold: float = Field(default=5.0, ge=0.0)
        """Average waiting requests per ready replica above which one replica is added."""
        idle_fraction: float = Field(default=0.25, ge=0.0, le=1.0)
        """Below this fraction of batch slots busy (and nothing waiting) one replica is removed."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or self.Params()

    def propose(self, ctx: ScalingContext) -> Proposal:
        capacity = float(ctx.capacity)
        if not ctx.has_metrics:
            return Proposal(capacity, "no fresh load metrics: holding capacity (unknown is not zero)")
        threshold = self.params.threshold
        idle_fraction = self.params.idle_fraction
        ready = len([r for r in ctx.fresh_ready if r.has_metrics])
        avg_waiting = ctx.queue_depth / ready
        slots = ready * ctx.max_num_seqs
        inputs = {"avg_waiting": round(avg_waiting, 3), "threshold": threshold}
        if avg_waiting > threshold:
            return Proposal(capacity + 1, f"avg waiting {avg_waiting:.1f} > {threshold:g}: add one", inputs)
        if ctx.queue_depth == 0 and ctx.running < idle_fraction * slots:
            return Proposal(capacity - 1, f"idle: nothing waiting, running {ctx.running:g} of {slots} slots", inputs)
        return Proposal(capacity, f"avg waiting {avg_waiting:.1f} <= {threshold:g}", inputs)
