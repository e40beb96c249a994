"""Guard-rails: the one chain of steps applied to every policy's proposal before it becomes a decision.

Each step is a small function ``(ctx, cfg, draft) -> draft`` (`control_plane.scaling.draft.Draft`); each sees the
previous one's numbers, and the reason names what bound last. In order (`GUARDRAILS`):

1. round the proposal up (`start`);
2. predictive term (`control_plane.scaling.predictive.predictive`): demand's trend over a cold start raises it;
3. SLO priority, availability > TTFT > throughput (`control_plane.scaling.slo_priority`): ``min`` restored, a
   queueing P99 over the SLO adds one, unknown load or a P99 near the SLO blocks shrinking;
4. bounds ``[min, max]`` (`control_plane.scaling.stabilise.bounds`);
5. the paid floor (`control_plane.scaling.stabilise.fill_paid`): on a target paid by the node, at least the
   replicas the node group's minimum nodes hold (``replicas.fillPaidNodes``, `fleet.capacity.paid_floor`);
6. stabilisation windows (`control_plane.scaling.stabilise.stabilise`), then, on a node group whose pools share
   its paid GPUs by demand, the cap that yields GPUs to another pool (`control_plane.scaling.stabilise.yield_paid`);
7. step limits ``maxScaleUpStep`` / ``maxScaleDownStep``;
8. the capacity translated back to a replica target;
9. nodes ahead (`control_plane.scaling.predictive.nodes_ahead`): ``nodes_for`` for pools that may need a new node.

Capacity (fresh ready + arriving replicas) is what the proposal is compared against; replicas still starting
count as capacity on its way, so a burst during a cold start does not launch a second wave.

The steps' memory between ticks is a typed `GuardrailState`, passed in and returned apart from the policy's own
state, the shape of Ray Serve's autoscaling policy wrapped by its shared guard-rails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.draft import EPS, Draft, GuardrailState
from control_plane.scaling.policies import Proposal
from control_plane.scaling.predictive import demand_trend, nodes_ahead, predictive
from control_plane.scaling.slo_priority import availability, block_shrink, ttft
from control_plane.scaling.stabilise import bounds, fill_paid, stabilise, step_limits, to_target, yield_paid
from fleet.spec.stack import AutoscalingSpec

__all__ = ["GUARDRAILS", "Guardrail", "GuardrailState", "Verdict", "apply_guardrails", "demand_trend", "start"]

Guardrail = Callable[[ScalingContext, AutoscalingSpec, Draft], Draft]

GUARDRAILS: tuple[Guardrail, ...] = (
    predictive,
    availability,
    ttft,
    block_shrink,
    bounds,
    fill_paid,
    stabilise,
    yield_paid,
    step_limits,
    to_target,
    nodes_ahead,
)


@dataclass(frozen=True)
class Verdict:
    """The guarded answer: ``target`` replicas for the pool (what the actuator should run), and why."""

    target: int
    capacity_target: int
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)
    state: GuardrailState = field(default_factory=GuardrailState)
    nodes_for: int | None = None  # replicas to provision nodes for (step 9)


def _observed(ctx: ScalingContext) -> dict[str, Any]:
    """The figures of ``ctx`` the decision log shows with every decision."""
    return {
        "capacity": ctx.capacity,
        "current": ctx.current,
        "ready": len(ctx.fresh_ready),
        "arriving": len(ctx.arriving),
        "draining": len(ctx.draining),
        "unknown": [r.replica for r in ctx.unknown],
        "failed": [r.replica for r in ctx.failed],
        "replacing": list(ctx.replacing),
        "queue_depth": ctx.queue_depth,
        "gateway_waiting": ctx.gateway_waiting,
        "request_rate": None if ctx.request_rate is None else round(ctx.request_rate, 3),
        "gateways_stale": ctx.gateways_stale,
        "per_replica_qps": None if ctx.per_replica_qps is None else round(ctx.per_replica_qps, 3),
        "running": ctx.running,
        "kv_usage_total": round(ctx.kv_usage_total, 4),
        "ttft_p99_s": ctx.ttft_p99_s,
        "ttft_slo_s": ctx.ttft_slo_s,
    }


def start(ctx: ScalingContext, proposal: Proposal, state: GuardrailState) -> Draft:
    """Step 1: the draft the chain begins from, the proposal rounded up."""
    inputs = {**_observed(ctx), "proposal": round(proposal.desired, 4), **dict(proposal.inputs)}
    desired = max(0, math.ceil(proposal.desired - EPS))
    return Draft(proposal, desired, proposal.reason, inputs, state, capacity=ctx.capacity)


def apply_guardrails(
    ctx: ScalingContext, proposal: Proposal, cfg: AutoscalingSpec, state: GuardrailState | None = None
) -> Verdict:
    """Turn ``proposal`` into a bounded, stabilised, SLO-ordered replica target (see module docstring);
    ``state`` is what the last tick's verdict carried (None: a pool's first tick)."""
    draft = start(ctx, proposal, state or GuardrailState())
    for step in GUARDRAILS:
        draft = step(ctx, cfg, draft)
    return Verdict(draft.target, draft.capacity, draft.reason, dict(draft.inputs), draft.state, draft.nodes_for)
