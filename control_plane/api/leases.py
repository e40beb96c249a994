"""Leases: the planned-restart leases agents take before restarting their replica.

    POST   /v1/leases/restart                 LeaseRequest -> 200 LeaseGrant | 409 (maxUnavailable held, or the
                                              pool's error budget is exhausted: restarts are frozen)
                                              | 503 (the lease store cannot be written: nothing granted)
    DELETE /v1/leases/restart/{pool}/{replica}                  -> 200 Released {"released": bool} | 503
    GET    /v1/leases                         LeasesResponse: current holders and the grant/release history

Taking and giving back a lease needs an agent's credential, and is refused with 403 unless the replica it names
last reported from the caller's address: an agent takes and gives back its own replica's lease only, so no pod can
hold a pool's leases to block its restarts, or release another replica's. Every grant and release is written to
the lease store (`control_plane.leases.leases`), awaited, so leases survive a restart of the control plane. Reading
them needs a control credential of any kind.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control_plane.api.deps import agent, control_plane, reader, unknown_pool
from control_plane.api.metrics import ControlPlaneMetrics, series
from control_plane.leases.leases import LeaseRefused, LeaseStoreError
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import error_response, errors
from fleet.protocol.control_auth import Caller, same_host
from fleet.protocol.wire import LeaseGrant, LeaseRequest, LeasesResponse, Released

__all__ = ["router"]

router = APIRouter()


def _not_its_replica(cp: ControlPlane, caller: Caller | None, pool: str, replica: str) -> JSONResponse | None:
    """403 unless ``caller`` (None: auth off) is the agent of ``replica``: the one that reported it from its own
    address."""
    if caller is None:
        return None
    last = next((s.report for s in cp.registry.seen(pool, cp.clock.time()) if s.report.replica == replica), None)
    if last is None or not same_host(last.engine_url, caller.ip):
        message = f"replica {replica!r} of {pool} has not reported from {caller.ip}: an agent holds its own lease only"
        return error_response(403, message, "replica", type_="permission_error")
    return None


def _store_down(exc: LeaseStoreError) -> JSONResponse:
    message = f"restart leases cannot be kept right now ({exc}); retry later"
    return error_response(503, message, None, type_="service_unavailable")


def _held(result: LeaseRefused, pool: str) -> JSONResponse:
    message = (
        f"pool {pool!r} already has {len(result.holders)} of {result.max_unavailable} restart "
        f"lease(s) held by {', '.join(result.holders)}; retry later"
    )
    return error_response(409, message, "replica")


@router.post("/v1/leases/restart", response_model=LeaseGrant, responses=errors(400, 401, 403, 404, 409, 503))
async def post_lease(
    req: LeaseRequest,
    caller: Caller | None = agent,
    cp: ControlPlane = control_plane,
    out: ControlPlaneMetrics = series,
) -> LeaseGrant | JSONResponse:
    """A planned-restart lease; 409 while the pool's ``maxUnavailable`` leases are held by others, 503 when the
    lease store cannot be written (no lease is granted that a restart would forget)."""
    if req.pool not in cp.pools:
        return unknown_pool(cp, req.pool)
    if (refusal := _not_its_replica(cp, caller, req.pool, req.replica)) is not None:
        return refusal
    if req.replica not in cp.leases.holders(req.pool, cp.clock.time()):  # a holder renewing is mid-restart already
        allowed, reason = await cp.budget_allows(req.pool, "restart")
        if not allowed:
            out.refused.labels(req.pool).inc()
            return error_response(409, f"{reason}; retry later", "pool")
    try:
        result = await cp.leases.acquire_and_save(req.pool, req.replica, cp.clock.time(), req.ttl_s)
    except LeaseStoreError as exc:
        return _store_down(exc)
    if isinstance(result, LeaseRefused):
        out.refused.labels(req.pool).inc()
        return _held(result, req.pool)
    return result


@router.delete("/v1/leases/restart/{pool}/{replica}", response_model=Released, responses=errors(401, 403, 404, 503))
async def delete_lease(
    pool: str, replica: str, caller: Caller | None = agent, cp: ControlPlane = control_plane
) -> Released | JSONResponse:
    """Give a restart lease back (``released`` is False when it was not held)."""
    if pool not in cp.pools:
        return unknown_pool(cp, pool)
    if (refusal := _not_its_replica(cp, caller, pool, replica)) is not None:
        return refusal
    try:
        return Released(released=await cp.leases.release_and_save(pool, replica, cp.clock.time()))
    except LeaseStoreError as exc:
        return _store_down(exc)


@router.get("/v1/leases", response_model=LeasesResponse, responses=errors(401), dependencies=[reader])
async def get_leases(cp: ControlPlane = control_plane) -> LeasesResponse:
    """Lease holders per pool and the recent lease events."""
    return LeasesResponse.model_validate(cp.leases.snapshot(cp.clock.time()))
