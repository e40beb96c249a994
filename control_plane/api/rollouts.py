"""Rollouts: the control plane's endpoints for canary rollouts and the alias weights gateways serve.

    GET    /v1/aliases               AliasWeights: every alias's weights now (gateways poll it with discovery)
    GET    /v1/rollouts              RolloutsResponse: each alias's rollout, running or the last finished
    GET    /v1/rollouts/{alias}      RolloutStatus | 404
    POST   /v1/rollouts              RolloutStart -> 200 RolloutStatus | 400 (unknown candidate, no baseline)
                                     | 404 (unknown alias) | 409 (one runs already, or the baseline's error budget
                                     is exhausted: rollouts are frozen, as restarts are)
    DELETE /v1/rollouts/{alias}      abort: the candidate back to 0 -> 200 RolloutStatus | 404 | 409 (finished)

Starting and aborting are writes: they need a control credential of kind ``control-plane`` (the fleet secret, or
the control plane's service-account token), as the agents' drain endpoint does; reads need a credential of any kind
(gateways read the alias weights with theirs). A start asks
`control_plane.plane.ControlPlane.budget_allows` whether the baseline's error budget lets it go ahead.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control_plane.api.deps import control_plane, operator, reader
from control_plane.plane import ControlPlane
from control_plane.rollouts import RolloutError
from fleet.protocol.control_api import error_response, errors
from fleet.protocol.wire import AliasWeights, RolloutsResponse, RolloutStart, RolloutStatus

__all__ = ["router"]

router = APIRouter()


def _refused(exc: RolloutError) -> JSONResponse:
    return error_response(exc.status, str(exc), exc.param)


@router.get("/v1/aliases", response_model=AliasWeights, responses=errors(401), dependencies=[reader])
async def get_aliases(cp: ControlPlane = control_plane) -> AliasWeights:
    """Every alias's weights as gateways should serve them now."""
    return cp.rollouts.alias_weights(cp.clock.time())


@router.get("/v1/rollouts", response_model=RolloutsResponse, responses=errors(401), dependencies=[reader])
async def list_rollouts(cp: ControlPlane = control_plane) -> RolloutsResponse:
    """Each alias's rollout: the running one, else the last finished."""
    return RolloutsResponse(rollouts=[cp.rollouts.status(alias) for alias in cp.rollouts.states])


@router.get("/v1/rollouts/{alias}", response_model=RolloutStatus, responses=errors(401, 404), dependencies=[reader])
async def get_rollout(alias: str, cp: ControlPlane = control_plane) -> RolloutStatus | JSONResponse:
    """One alias's rollout, with both pools' figures over the current step's window."""
    try:
        return cp.rollouts.status(alias)
    except RolloutError as exc:
        return _refused(exc)


@router.post(
    "/v1/rollouts",
    response_model=RolloutStatus,
    responses=errors(400, 401, 403, 404, 409),
    dependencies=[operator],
)
async def start_rollout(req: RolloutStart, cp: ControlPlane = control_plane) -> RolloutStatus | JSONResponse:
    """Start rolling ``alias`` to ``candidate`` with the stack's ``aliases.<alias>.rollout`` settings."""
    try:
        plan = cp.rollouts.plan(req.alias, req.candidate)
    except RolloutError as exc:
        return _refused(exc)
    allowed, reason = await cp.budget_allows(plan.baseline, "rollout")
    if not allowed:
        return error_response(409, f"rollout of {req.alias} refused: {reason}; retry later", "alias")
    try:
        cp.rollouts.start(plan, cp.clock.time())
    except RolloutError as exc:
        return _refused(exc)
    await cp.rollouts.save()
    return cp.rollouts.status(req.alias)


@router.delete(
    "/v1/rollouts/{alias}",
    response_model=RolloutStatus,
    responses=errors(401, 403, 404, 409),
    dependencies=[operator],
)
async def abort_rollout(alias: str, cp: ControlPlane = control_plane) -> RolloutStatus | JSONResponse:
    """Abort the running rollout of ``alias``: its candidate back to weight 0."""
    try:
        cp.rollouts.abort(alias, cp.clock.time())
    except RolloutError as exc:
        return _refused(exc)
    await cp.rollouts.save()
    return cp.rollouts.status(alias)
