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

from autoscaler.context import ScalingContext
from autoscaler.policies import Proposal, ScalingPolicy

__all__ = ["Threshold"]


class Threshold(ScalingPolicy, name="threshold"):
    def propose(self, ctx: ScalingContext) -> Proposal:
        capacity = float(ctx.capacity)
        if not ctx.has_metrics:
            return Proposal(capacity, "no fresh load metrics: holding capacity (unknown is not zero)")
        threshold = float(ctx.params.get("threshold", 5.0))
        idle_fraction = float(ctx.params.get("idleFraction", 0.25))
        ready = len([r for r in ctx.fresh_ready if r.has_metrics])
        avg_waiting = ctx.queue_depth / ready
        slots = ready * ctx.max_num_seqs
        inputs = {"avg_waiting": round(avg_waiting, 3), "threshold": threshold}
        if avg_waiting > threshold:
            return Proposal(capacity + 1, f"avg waiting {avg_waiting:.1f} > {threshold:g}: add one", inputs)
        if ctx.queue_depth == 0 and ctx.running < idle_fraction * slots:
            return Proposal(capacity - 1, f"idle: nothing waiting, running {ctx.running:g} of {slots} slots", inputs)
        return Proposal(capacity, f"avg waiting {avg_waiting:.1f} <= {threshold:g}", inputs)
