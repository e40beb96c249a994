"""Pools: what the control plane knows of each pool, for operators and for the gateways' discovery.

    GET    /v1/pools                          PoolsResponse: pools with bounds, counts, last decision, measured
                                              starts (`control_plane.starts`) and node starts (the aws actuator's,
                                              `control_plane.actuators.node_starts`)
    GET    /v1/pools/{pool}/budget            PoolBudget: the pool's error budget per SLO
                                              (`control_plane.budget.budget`) and whether risky changes may go ahead
    GET    /v1/pools/{pool}/replicas          ReplicaList (discovery for gateways; ``stale`` flag per replica);
                                              503 while a control plane that just started is still hearing from
                                              the pool's agents (`control_plane.startup`): gateways keep their list
    GET    /v1/decisions[?pool=P&limit=N]     DecisionsResponse: decisions, newest last, each with inputs and reason

Reads, for fleet members only (`control_plane.api.deps.reader`: a control credential of any kind, 401 without one):
the replica list gives every engine's address, the decisions and summaries the fleet's shape.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control_plane.api.deps import control_plane, reader, unknown_pool
from control_plane.plane import ControlPlane
from control_plane.scaling.decisions import decision_to_json
from fleet.protocol.control_api import error_response, errors
from fleet.protocol.pools_wire import PoolsResponse, PoolSummary
from fleet.protocol.wire import DecisionsResponse, PoolBudget, ReplicaList, ReplicaState, SloBudget
from fleet.spec.stack import PoolSpec

__all__ = ["router"]

router = APIRouter(dependencies=[reader])


def _summary(cp: ControlPlane, pool: PoolSpec, now: float) -> PoolSummary:
    seen = cp.registry.seen(pool.name, now)
    last = cp.loop.last.get(pool.name) if cp.loop else None
    return PoolSummary(
        pool=pool.name,
        model=pool.served_name,
        min=pool.replicas.min,
        max=pool.replicas.max,
        replicas=len([s for s in seen if s.report.state != ReplicaState.STOPPED]),
        ready=len([s for s in seen if s.report.state == ReplicaState.READY and not s.stale]),
        stale=len([s for s in seen if s.stale]),
        last_decision=decision_to_json(last) if last else None,
        starts=cp.starts.summary(pool.name, pool.cold_start_seconds),
        node_starts=cp.loop.actuator.measured_node_starts(pool) if cp.loop else None,
    )


@router.get("/v1/pools", response_model=PoolsResponse, responses=errors(401))
async def get_pools(cp: ControlPlane = control_plane) -> PoolsResponse:
    """Every pool, prefill role pools included: bounds, replica counts and the last decision."""
    now = cp.clock.time()
    return PoolsResponse(pools=[_summary(cp, pool, now) for pool in cp.spec.engine_pools], generated_at=now)


@router.get("/v1/pools/{pool}/budget", response_model=PoolBudget, responses=errors(401, 404))
async def get_budget(pool: str, cp: ControlPlane = control_plane) -> PoolBudget | JSONResponse:
    """The pool's error budget per SLO over ``slo.budgetWindow`` (planned restart windows excluded), read
    again from the budget source when older than its refresh period, and whether risky changes may go ahead."""
    if pool not in cp.pools:
        return unknown_pool(cp, pool)
    known = await cp.budgets.current(pool, cp.clock.time())
    allowed, reason = cp.budgets.decide(pool, "a risky change")
    slo = cp.pools[pool].slo
    return PoolBudget(
        pool=pool,
        source=cp.budgets.source.name,
        computed_at=known.at,
        error=known.error,
        freeze=slo.freeze_on_exhausted_budget,
        allows_changes=allowed,
        reason=reason,
        slos=[SloBudget.model_validate({**asdict(b), "window": slo.budget_window}) for b in known.budgets],
    )


@router.get("/v1/pools/{pool}/replicas", response_model=ReplicaList, responses=errors(401, 404, 503))
async def get_replicas(pool: str, cp: ControlPlane = control_plane) -> ReplicaList | JSONResponse:
    """Discovery for gateways: the pool's replicas (stopped ones excluded), each with its ``stale`` flag; 503
    until a control plane that just started has heard from the pool's agents."""
    if pool not in cp.pools:
        return unknown_pool(cp, pool)
    now = cp.clock.time()
    if not cp.settled(pool, now):
        message = f"the control plane just started and is waiting for pool {pool!r}'s agents to report; retry"
        return error_response(503, message, None, type_="service_unavailable")
    return cp.registry.replica_list(pool, cp.pools[pool].served_name, now)


@router.get("/v1/decisions", response_model=DecisionsResponse, responses=errors(400, 401))
async def get_decisions(
    pool: str | None = None, limit: int = 100, cp: ControlPlane = control_plane
) -> DecisionsResponse:
    """The last ``limit`` decisions (of ``pool``, or of every pool), oldest first."""
    if cp.loop is None or limit <= 0:
        return DecisionsResponse(decisions=[])
    items = [d for d in cp.loop.decisions if pool is None or d.pool == pool][-limit:]
    return DecisionsResponse(decisions=[decision_to_json(d) for d in items])
