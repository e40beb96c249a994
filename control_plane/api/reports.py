"""Reports: what agents and gateways push to the control plane.

    POST   /v1/reports                        LoadReport from an agent             -> 200 Accepted
    POST   /v1/gateway-reports                GatewayReport from a gateway (its admission queue and request rate
                                              per pool) -> 200 GatewayAccepted (its share of the pool's admission
                                              capacity, `control_plane.shares`)

A report from an agent needs an agent's credential and one from a gateway a gateway's. A report whose
``engine_url`` host is not the caller's own address (`fleet.protocol.control_auth.same_host`) is refused with 403
and never reaches the registry, so no pod can point gateways at another host. A gateway's report also names the
gateway to the error budget's ``local`` source (its admin /metrics, at the report's source address).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from control_plane.api.deps import agent, control_plane, gateway, unknown_pool
from control_plane.api.metrics import ControlPlaneMetrics, series
from control_plane.plane import ControlPlane
from control_plane.shares import admission_shares, grantable
from fleet.protocol.control_api import error_response, errors
from fleet.protocol.control_auth import Caller, same_host
from fleet.protocol.wire import Accepted, GatewayAccepted, GatewayReport, LoadReport

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/reports", response_model=Accepted, responses=errors(400, 401, 403, 404))
async def post_report(
    report: LoadReport,
    caller: Caller | None = agent,
    cp: ControlPlane = control_plane,
    out: ControlPlaneMetrics = series,
) -> Accepted | JSONResponse:
    """An agent's load report (about once a second); 403 when its ``engine_url`` is not the caller's host."""
    if report.pool not in cp.pools:
        return unknown_pool(cp, report.pool)
    if caller is not None and not same_host(report.engine_url, caller.ip):
        message = f"engine_url {report.engine_url} is not on the reporting host {caller.ip}"
        return error_response(403, message, "engine_url", type_="permission_error")
    cp.registry.record(report, cp.clock.time())
    cp.starts.record(report, cp.pools[report.pool].cold_start_seconds)
    out.reports.labels(report.pool).inc()
    return Accepted(accepted=True, stale_after_s=cp.registry.stale_after_s)


def _share(cp: ControlPlane, report: GatewayReport, now: float) -> tuple[float | None, int]:
    """The gateway's admission share of its pool (None: no capacity to divide yet, the gateway keeps its floor),
    and how many gateways share it."""
    live = {s.report.gateway: s.report for s in cp.gateways.seen(report.pool, now) if not s.stale}
    capacity = cp.admission_capacity(report.pool, now)
    if capacity <= 0:
        return None, len(live)
    target = admission_shares({g: r.demand for g, r in live.items()}, capacity)[report.gateway]
    held = {g: max(cp.granted.get((report.pool, g), 0.0), r.in_flight / capacity) for g, r in live.items()}
    share = grantable(report.gateway, target, held)
    cp.granted[(report.pool, report.gateway)] = share
    return share, len(live)


@router.post(
    "/v1/gateway-reports",
    response_model=GatewayAccepted,
    responses=errors(400, 401, 403, 404),
    dependencies=[gateway],
)
async def post_gateway_report(
    report: GatewayReport, request: Request, cp: ControlPlane = control_plane, out: ControlPlaneMetrics = series
) -> GatewayAccepted | JSONResponse:
    """A gateway's admission queue and request rates for one pool; the answer carries its admission share."""
    if report.pool not in cp.pools:
        return unknown_pool(cp, report.pool)
    now = cp.clock.time()
    cp.gateways.record(report, now)
    cp.rollouts.ledger.record(report.pool, report.outcomes, now)
    if request.client is not None:
        host = request.client.host
        admin = f"[{host}]" if ":" in host else host
        cp.budgets.saw_gateway(report.gateway, f"http://{admin}:{cp.spec.gateway.admin_port}/metrics", now)
        cp.budgets.refresh_later(now)
    out.gateway_reports.labels(report.pool).inc()
    out.gateway_waiting.labels(report.pool, report.gateway).set(report.waiting)
    share, gateways = _share(cp, report, now)
    return GatewayAccepted(
        accepted=True, stale_after_s=cp.gateways.stale_after_s, admission_share=share, gateways=gateways
    )
