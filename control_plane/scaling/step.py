"""One decision step: a frozen snapshot of one pool in, a decision out. The live loop and the fleet simulation
both call `decide`, so they decide from the same history the same way.

    replicas + gateway sums + demand window + state (the policy's, the guard-rails')
        -> build_context -> demand window advanced (current sample included) -> policy -> guard-rails
        -> Decision (+ the state and window to carry to the next step)

The demand window holds ``(t, demand)`` samples of the ticks that had fresh metrics, over
``max(coldStartSeconds, 3 x intervalS)``. The current tick's sample is part of the history the predictive term
reads (its trend would otherwise lag one tick). Nothing here performs I/O or reads a clock: ``now`` comes in.

The carried `ScalingState` keeps the policy's state (``Proposal.state``: keys a policy leaves out keep their last
value) apart from the guard-rails' typed `GuardrailState`, so neither can overwrite the other's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from control_plane.scaling.context import ReplicaLoad, ScalingContext, build_context
from control_plane.scaling.decisions import Decision, Hold, ScaleDown, ScaleUp
from control_plane.scaling.guardrails import GuardrailState, Verdict, apply_guardrails
from control_plane.scaling.policies import ScalingPolicy
from fleet.capacity.paid_floor import PaidFloor
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import AutoscalingSpec, PoolSpec

__all__ = [
    "DemandHistory",
    "ScalingState",
    "Step",
    "advance_window",
    "decide",
    "pick_victims",
    "run_policy",
    "to_sleep",
    "to_wake",
    "window_horizon",
]

DemandHistory = tuple[tuple[float, float], ...]


def pick_victims(ctx: ScalingContext, count: int) -> tuple[str, ...]:
    """The ``count`` replicas to remove: failed ones first, then ones still launching (no traffic, nothing to
    drain), then ready ones by least load (running + waiting, then KV usage). Replicas of unknown load (stale,
    no metrics) come last: they are never taken for idle ones."""
    gone = (ReplicaState.DRAINING, ReplicaState.STOPPED, ReplicaState.SLEEPING)
    candidates = [r for r in ctx.replicas if r.state not in gone]

    def order(r: ReplicaLoad) -> tuple[int, float, float, str]:
        if r.state == ReplicaState.FAILED and not r.stale:
            return (-1, 0.0, 0.0, r.replica)  # broken: serves nothing, goes first
        unknown = r.stale or (r.state == ReplicaState.READY and not r.has_metrics)
        rank = 3 if unknown else 0 if r.state == ReplicaState.LAUNCHING else 1 if r.state != ReplicaState.READY else 2
        return (rank, r.load, r.kv_usage if r.kv_usage is not None else 1.0, r.replica)

    return tuple(r.replica for r in sorted(candidates, key=order)[:count])


def advance_window(history: DemandHistory, now: float, demand: float, horizon_s: float) -> DemandHistory:
    """``history`` with ``(now, demand)`` appended and samples older than ``horizon_s`` dropped."""
    return tuple((t, v) for t, v in (*history, (now, demand)) if now - t <= horizon_s)


def window_horizon(pool: PoolSpec, autoscaling: AutoscalingSpec) -> float:
    """How far back the demand window reaches: a cold start, at least three ticks."""
    return max(pool.cold_start_seconds, 3 * autoscaling.interval_s)


@dataclass(frozen=True)
class ScalingState:
    """What one pool's step carries to its next: the policy's own state and the guard-rails', apart."""

    policy: Mapping[str, Any] = field(default_factory=dict)
    guardrails: GuardrailState = field(default_factory=GuardrailState)


def run_policy(
    policy: ScalingPolicy, ctx: ScalingContext, autoscaling: AutoscalingSpec, guardrails: GuardrailState
) -> tuple[Verdict, ScalingState]:
    """``policy``'s proposal for ``ctx`` (whose ``state`` is the policy's own) through the guard-rails, and the
    state to carry to the next tick."""
    proposal = policy.propose(ctx)
    verdict = apply_guardrails(ctx, proposal, autoscaling, guardrails)
    return verdict, ScalingState({**ctx.state, **dict(proposal.state)}, verdict.state)


@dataclass(frozen=True)
class Step:
    """What one step decided, and what the caller carries to the next step of the same pool."""

    decision: Decision
    context: ScalingContext
    state: ScalingState = field(default_factory=ScalingState)
    demand_history: DemandHistory = ()


def decide(
    pool: PoolSpec,
    autoscaling: AutoscalingSpec,
    policy: ScalingPolicy,
    replicas: tuple[ReplicaLoad, ...],
    now: float,
    *,
    gateway: tuple[float | None, float | None, int] = (None, None, 0),
    per_replica_qps: float | None = None,
    demand_history: DemandHistory = (),
    state: ScalingState | None = None,
    node_lead_s: float = 0.0,
    paid: PaidFloor | None = None,
    replacing: tuple[str, ...] = (),
) -> Step:
    """One pool, one tick: the decision (not yet applied), with the next state and demand window. ``paid`` is the
    pool's paid floor (`fleet.capacity.paid_floor.paid_floor`, fixed when the caller is built; None: none);
    ``replacing`` the replicas that died within a cold start (`control_plane.scaling.departures`)."""
    state = state or ScalingState()
    ctx = build_context(
        pool,
        autoscaling,
        replicas,
        now,
        gateway=gateway,
        per_replica_qps=per_replica_qps,
        demand_history=demand_history,
        state=state.policy,
        node_lead_s=node_lead_s,
        paid=paid,
        replacing=replacing,
    )
    if ctx.has_metrics:
        history = advance_window(demand_history, now, ctx.demand, window_horizon(pool, autoscaling))
        ctx = replace(ctx, demand_history=history)
    verdict, carried = run_policy(policy, ctx, autoscaling, state.guardrails)
    common: dict[str, Any] = {
        "pool": pool.name,
        "current": ctx.current,
        "target": verdict.target,
        "reason": verdict.reason,
        "at": now,
        "inputs": {**verdict.inputs, "replicas": [asdict(r) for r in ctx.replicas]},
        "policy": policy.name,
        "nodes_for": verdict.nodes_for,
    }
    decision: Decision
    asleep = len(ctx.asleep)
    if verdict.target > ctx.current:
        wake = to_wake(pool, ctx, verdict.target - ctx.current)
        decision = ScaleUp(**common, asleep=asleep - len(wake), wake=wake)
    elif verdict.target < ctx.current:
        victims = pick_victims(ctx, ctx.current - verdict.target)
        sleep = to_sleep(pool, ctx, victims, verdict.target)
        victims = tuple(v for v in victims if v not in sleep)
        decision = ScaleDown(**common, asleep=asleep + len(sleep), victims=victims, drain=True, sleep=sleep)
    else:
        decision = Hold(**common, asleep=asleep)
    return Step(decision, ctx, carried, ctx.demand_history)


def to_wake(pool: PoolSpec, ctx: ScalingContext, count: int) -> tuple[str, ...]:
    """Sleep mode: the sleeping replicas a scale-up of ``count`` wakes (about a second each) before it starts new
    ones (a cold start each)."""
    if not pool.engine.sleep_mode:
        return ()
    return tuple(sorted(r.replica for r in ctx.asleep))[:count]


def to_sleep(pool: PoolSpec, ctx: ScalingContext, victims: tuple[str, ...], target: int) -> tuple[str, ...]:
    """Sleep mode: the ``victims`` a scale-down to ``target`` puts to sleep instead of stopping. Only ready
    replicas sleep (a failed or starting one has nothing worth keeping), and at most ``replicas.max - target``
    sleep in all, so the pool never holds more GPUs than ``replicas.max``. None sleeps while the pool yields paid
    GPUs to another pool of its node group (``ctx.paid_cap``): a sleeping engine keeps its GPU."""
    if not pool.engine.sleep_mode or ctx.paid_cap is not None:
        return ()
    room = max(0, pool.replicas.max - target - len(ctx.asleep))
    ready = {r.replica for r in ctx.fresh_ready}
    return tuple(v for v in victims if v in ready)[:room]
