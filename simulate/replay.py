"""A replay: one stack, one trace prepared once (scaled, cut, too-long requests dropped), several configurations.

`prepare` fixes everything the configurations share: the pool as the simulation runs it (its ``workload`` set to
the trace's measured token mix and peak rate, as an operator would describe this traffic in the stack, so the
capacity plan and the scaler's request-rate term are the plan for *this* trace), the plan, the yardsticks
(`simulate.bounds`: replica-hours and paid GPU-hours; the oracle scaler, `simulate.oracle`) and the replica
count ``fixed`` runs. `run_config` then simulates one configuration; it
takes only picklable arguments, so configurations run in parallel processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from control_plane.loop import node_lead
from fleet.capacity.paid_floor import paid_floor
from fleet.capacity.plan import PoolPlan, plan_pool, step_model
from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec, PoolSpec
from llmfleet.registries import all_registries
from simulate.billing import NodeBilling
from simulate.bounds import (
    clairvoyant_paid_gpu_seconds,
    clairvoyant_replica_seconds,
    infinite_cache_hit_rate,
    needed_replicas,
)
from simulate.configs import Config, make_controller, make_router
from simulate.fleet_sim import FleetSim, Scaler
from simulate.oracle import ORACLE_INTERVAL_S, OracleScaler
from simulate.result import Result
from simulate.trace import TraceRequest

__all__ = ["BOUND_INTERVAL_S", "PEAK_WINDOW_S", "Prepared", "peak_rate", "prepare", "run_all", "run_config"]

PEAK_WINDOW_S = 60.0  # the trace's peak rate: the busiest minute
# The bound's intervals: a minute, as the plan's peak rate. Within it a replica's batch absorbs a burst above its
# at-SLO rate (the rate is where decode speed meets the SLO, not where the batch is full), so shorter intervals
# would count a ten-second burst as replicas no scaler needs.
BOUND_INTERVAL_S = PEAK_WINDOW_S


def peak_rate(trace: Sequence[TraceRequest], window_s: float = PEAK_WINDOW_S) -> float:
    """Requests/s of the busiest ``window_s`` (sliding over arrivals)."""
    best, lo = 0, 0
    for hi, r in enumerate(trace):
        while r.t - trace[lo].t >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    span = min(window_s, trace[-1].t - trace[0].t) if trace else 0.0
    return best / span if span > 0 else float(best)


@dataclass(frozen=True)
class Prepared:
    stack: str
    pool: PoolSpec
    trace: tuple[TraceRequest, ...]
    plan: PoolPlan
    too_long: int  # requests dropped: prompt + output above maxModelLen
    slo_infeasible: int  # requests whose prefill alone, on an idle replica, takes longer than the TTFT SLO
    fixed_replicas: int
    initial_replicas: int  # ready at t=0 under a scaler
    bound_replica_s: float
    cache_ceiling: float
    needed: tuple[int, ...] = field(default=())
    floor_rids: frozenset[str] = field(default=frozenset())  # the ``slo_infeasible`` requests, by id
    bound_paid_gpu_s: float = 0.0  # the clairvoyant bound at node granularity
    oracle: OracleScaler | None = None
    # the stack's paid floor (`fleet.capacity.paid_floor`; 0: none): a scaler holding it was running that many
    # before the trace began, so it starts with at least these ready
    paid_floor: int = 0


def _spec(stack: str) -> FleetSpec:
    return load_spec(stack, registries=all_registries()).spec


def _ttft_floor(spec: FleetSpec, pool: PoolSpec, kept: Sequence[TraceRequest]) -> frozenset[str]:
    """The requests whose prefill alone, on an idle replica, takes longer than the TTFT SLO."""
    steps = step_model(spec, pool)
    slo = pool.slo.ttft_p99_ms / 1000.0
    chunk = pool.engine.max_num_batched_tokens
    idle: dict[int, float] = {}
    for r in kept:
        if r.prompt_tokens not in idle:
            idle[r.prompt_tokens] = steps.prefill_seconds(r.prompt_tokens, chunk)
    return frozenset(r.rid for r in kept if idle[r.prompt_tokens] > slo)


def _oracle(spec: FleetSpec, pool: PoolSpec, kept: Sequence[TraceRequest], per_replica_qps: float) -> OracleScaler:
    return OracleScaler.for_need(
        pool.name,
        needed_replicas(kept, per_replica_qps, ORACLE_INTERVAL_S, pool.replicas.min),
        cold_start_s=pool.cold_start_seconds,
        tick_s=spec.autoscaling.interval_s,
        node_lead_s=node_lead(spec, pool),
        bounds=(pool.replicas.min, pool.replicas.max),
    )


def prepare(
    stack: str,
    trace: Sequence[TraceRequest],
    *,
    pool_name: str | None = None,
    max_model_len: int | None = None,
) -> Prepared:
    spec = _spec(stack)
    pool = next((p for p in spec.pools if p.name == pool_name), None) if pool_name else spec.pools[0]
    if pool is None:
        raise ValueError(f"stack {stack} has no pool {pool_name!r}; pools: {', '.join(p.name for p in spec.pools)}")
    if max_model_len is not None:
        pool = pool.model_copy(update={"engine": pool.engine.model_copy(update={"max_model_len": max_model_len})})
    limit = pool.engine.max_model_len
    kept = tuple(r for r in trace if r.prompt_tokens + r.output_tokens <= limit)
    if not kept:
        raise ValueError(f"every request of the trace is longer than maxModelLen {limit}")
    ceiling = infinite_cache_hit_rate(kept)
    workload = pool.workload.model_copy(
        update={
            "mean_prompt_tokens": max(1, round(sum(r.prompt_tokens for r in kept) / len(kept))),
            "mean_output_tokens": max(1, round(sum(r.output_tokens for r in kept) / len(kept))),
            "peak_qps": peak_rate(kept),
            "cached_prompt_fraction": min(0.95, ceiling),
            "per_replica_qps": None,
        }
    )
    pool = pool.model_copy(update={"workload": workload})
    plan = plan_pool(spec, pool)
    if plan.per_replica_qps <= 0:
        raise ValueError(f"the plan gives pool {pool.name} no capacity for this trace: {'; '.join(plan.notes)}")
    interval = BOUND_INTERVAL_S
    floor_rids = _ttft_floor(spec, pool, kept)
    needed = needed_replicas(kept, plan.per_replica_qps, interval, pool.replicas.min)
    # The pool was serving before the trace began: it starts with what the first cold start's worth of the trace
    # needs (no scaler could have more ready by then), and so does the bound.
    lead = needed[: math.ceil(pool.cold_start_seconds / interval) + 1]
    initial = min(pool.replicas.max, max([pool.replicas.min, *lead]))
    bound = clairvoyant_replica_seconds(needed, interval, pool.cold_start_seconds, initial=initial)
    node_s = node_lead(spec, pool)
    paid_bound = clairvoyant_paid_gpu_seconds(
        needed, interval, pool.cold_start_seconds + node_s, NodeBilling.for_pool(spec, pool).paid_gpus
    )
    return Prepared(
        stack=stack,
        pool=pool,
        trace=kept,
        plan=plan,
        too_long=len(trace) - len(kept),
        slo_infeasible=len(floor_rids),
        fixed_replicas=plan.replicas_peak,
        initial_replicas=initial,
        bound_replica_s=bound,
        cache_ceiling=ceiling,
        needed=tuple(needed),
        floor_rids=floor_rids,
        bound_paid_gpu_s=paid_bound,
        oracle=_oracle(spec, pool, kept, plan.per_replica_qps),
        paid_floor=0 if (floor := paid_floor(spec, pool)) is None else floor.replicas,
    )


def run_config(prepared: Prepared, config: Config, seed: int, *, decode_runs: bool = True) -> Result:
    """Simulate ``config`` on the prepared trace (``decode_runs=False``: one event per engine step, for
    measuring what decode runs save; the results are the same)."""
    spec = _spec(prepared.stack)
    pool = prepared.pool
    controller: Scaler | None
    if config.scaling == "oracle":
        assert prepared.oracle is not None
        controller = prepared.oracle
        initial = prepared.oracle.target(0.0)[0]  # ordered before the trace began
    else:
        controller = make_controller(spec, pool, config.scaling)
        initial = prepared.fixed_replicas if controller is None else max(prepared.initial_replicas, prepared.paid_floor)
    if controller is None and config.replicas is not None:
        initial = config.replicas
    sim = FleetSim(
        spec,
        pool,
        make_router(spec, config.routing, seed),
        controller,
        prepared.trace,
        name=config.name,
        initial_replicas=initial,
        floor_rids=prepared.floor_rids,
        decode_runs=decode_runs,
        kv_delay_s=config.kv_delay_s,
        initial_age_s=config.age_s,
    )
    return sim.run()


def run_all(prepared: Prepared, configs: Sequence[Config], seed: int, jobs: int = 1) -> list[Result]:
    """`run_config` for each of ``configs``, in their order, ``jobs`` processes at a time (1: in this one)."""
    jobs = max(1, min(jobs, len(configs)))
    if jobs == 1:
        return [run_config(prepared, c, seed) for c in configs]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_config, [prepared] * len(configs), configs, [seed] * len(configs)))
