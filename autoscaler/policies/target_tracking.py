"""TargetTracking (``target-tracking``, the default): size the pool so queue depth, KV usage and batch
occupancy each sit at their per-replica target.

    desired = max( queue_depth / targetQueuePerReplica,
                   sum(kv_usage) / targetKvUsage,
                   running / (maxNumSeqs * targetUtilisation) )

over fresh ready replicas only. The KV term is the one that matters for long contexts (memory bounds
concurrency, not QPS); the queue term reacts first to a burst. With no fresh metrics at all the policy
proposes the current capacity: unknown load is never read as zero.

Parameters (``autoscaling.policy.params``): ``targetQueuePerReplica``, ``targetKvUsage``,
``targetUtilisation`` override the stack-wide targets.

    autoscaling:
      policy: {name: target-tracking, params: {targetQueuePerReplica: 4}}
"""

from __future__ import annotations

from autoscaler.context import ScalingContext
from autoscaler.policies import Proposal, ScalingPolicy

__all__ = ["TargetTracking"]


class TargetTracking(ScalingPolicy, name="target-tracking"):
    def propose(self, ctx: ScalingContext) -> Proposal:
        if not ctx.has_metrics:
            return Proposal(float(ctx.capacity), "no fresh load metrics: holding capacity (unknown is not zero)")
        target_q = float(ctx.params.get("targetQueuePerReplica", ctx.target_queue_per_replica))
        target_kv = float(ctx.params.get("targetKvUsage", ctx.target_kv_usage))
        target_u = float(ctx.params.get("targetUtilisation", ctx.target_utilisation))
        terms = {
            "queue": ctx.queue_depth / target_q,
            "kv": ctx.kv_usage_total / target_kv,
            "utilisation": ctx.running / (ctx.max_num_seqs * target_u),
        }
        signal = max(terms, key=lambda k: terms[k])
        desired = terms[signal]
        inputs = {f"{k}_replicas": round(v, 3) for k, v in terms.items()}
        reason = (
            f"{signal} needs {desired:.2f} replicas "
            f"(queue {ctx.queue_depth:g} / target {target_q:g} per replica, "
            f"KV {ctx.kv_usage_total:.2f} / {target_kv:g}, running {ctx.running:g} / "
            f"{ctx.max_num_seqs}x{target_u:g})"
        )
        return Proposal(desired, reason, inputs)
