"""Control plane API on aiohttp: the previous implementation, kept as the intake benchmark's baseline.

This is the control plane's ``create_app`` as it was when the control plane served its API with aiohttp (before it
moved to FastAPI, now `control_plane.api.app`), unchanged but for its imports, its clock (a
`fleet.protocol.clock.Clock`) and its series: it builds the control plane's own `ControlPlaneMetrics` (which adds
the error-budget gauge the aiohttp version predates) rather than a copy of their declarations.
``bench/control_plane_intake.py`` serves it and the current app side by side so the cost of the move is measured,
not guessed. Bench-only: nothing imports it outside ``bench/``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from pydantic import ValidationError

from control_plane.api.metrics import ControlPlaneMetrics
from control_plane.leases.leases import LeaseRefused
from control_plane.plane import ControlPlane
from control_plane.scaling.decisions import decision_to_json
from fleet.protocol.wire import GatewayReport, LeaseRequest, LoadReport

__all__ = ["create_app"]


def error_response(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def _dump(model: Any) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


async def _read(request: web.Request, model: type[Any]) -> Any:
    try:
        return model.model_validate_json(await request.read())
    except ValidationError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {"error": {"message": str(exc), "type": "invalid_request_error", "param": None, "code": 400}}
            ),
            content_type="application/json",
        ) from None


def create_app(cp: ControlPlane) -> web.Application:
    """The aiohttp application serving `cp`."""
    pools = {p.name: p for p in cp.spec.pools}
    series = ControlPlaneMetrics(cp.metrics)
    reports, replicas_g, stale_g = series.reports, series.replicas, series.stale
    target_g, leases_g, refused = series.target, series.leases, series.refused
    gateway_reports, gateway_waiting = series.gateway_reports, series.gateway_waiting

    def unknown_pool(name: str) -> web.Response:
        return error_response(404, f"no pool {name!r}; pools: {', '.join(pools)}", "not_found_error", "pool")

    async def post_report(request: web.Request) -> web.Response:
        report: LoadReport = await _read(request, LoadReport)
        if report.pool not in pools:
            return unknown_pool(report.pool)
        cp.registry.record(report, cp.clock.time())
        reports.labels(report.pool).inc()
        return web.json_response({"accepted": True, "stale_after_s": cp.registry.stale_after_s})

    async def post_gateway_report(request: web.Request) -> web.Response:
        report: GatewayReport = await _read(request, GatewayReport)
        if report.pool not in pools:
            return unknown_pool(report.pool)
        cp.gateways.record(report, cp.clock.time())
        gateway_reports.labels(report.pool).inc()
        gateway_waiting.labels(report.pool, report.gateway).set(report.waiting)
        return web.json_response({"accepted": True, "stale_after_s": cp.gateways.stale_after_s})

    async def get_replicas(request: web.Request) -> web.Response:
        name = request.match_info["pool"]
        if name not in pools:
            return unknown_pool(name)
        return _dump(cp.registry.replica_list(name, pools[name].served_name, cp.clock.time()))

    async def get_pools(request: web.Request) -> web.Response:
        del request  # Unused.
        now = cp.clock.time()
        out = []
        for pool in cp.spec.pools:
            seen = cp.registry.seen(pool.name, now)
            last = cp.loop.last.get(pool.name) if cp.loop else None
            out.append(
                {
                    "pool": pool.name,
                    "model": pool.served_name,
                    "min": pool.replicas.min,
                    "max": pool.replicas.max,
                    "replicas": len([s for s in seen if s.report.state != "stopped"]),
                    "ready": len([s for s in seen if s.report.state == "ready" and not s.stale]),
                    "stale": len([s for s in seen if s.stale]),
                    "last_decision": decision_to_json(last) if last else None,
                }
            )
        return web.json_response({"pools": out, "generated_at": now})

    async def post_lease(request: web.Request) -> web.Response:
        req: LeaseRequest = await _read(request, LeaseRequest)
        if req.pool not in pools:
            return unknown_pool(req.pool)
        result = cp.leases.acquire(req.pool, req.replica, cp.clock.time(), req.ttl_s)
        if isinstance(result, LeaseRefused):
            refused.labels(req.pool).inc()
            return error_response(
                409,
                f"pool {req.pool!r} already has {len(result.holders)} of {result.max_unavailable} restart "
                f"lease(s) held by {', '.join(result.holders)}; retry later",
                "conflict_error",
                "replica",
            )
        return _dump(result)

    async def delete_lease(request: web.Request) -> web.Response:
        pool, replica = request.match_info["pool"], request.match_info["replica"]
        if pool not in pools:
            return unknown_pool(pool)
        return web.json_response({"released": cp.leases.release(pool, replica, cp.clock.time())})

    async def get_leases(request: web.Request) -> web.Response:
        del request  # Unused.
        return web.json_response(cp.leases.snapshot(cp.clock.time()))

    async def get_decisions(request: web.Request) -> web.Response:
        if cp.loop is None:
            return web.json_response({"decisions": []})
        pool = request.query.get("pool")
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return error_response(400, "limit must be an integer", "invalid_request_error", "limit")
        items = [d for d in cp.loop.decisions if pool is None or d.pool == pool][-limit:] if limit > 0 else []
        return web.json_response({"decisions": [decision_to_json(d) for d in items]})

    async def metrics(request: web.Request) -> web.Response:
        del request  # Unused.
        now = cp.clock.time()
        for pool in cp.spec.pools:
            seen = cp.registry.seen(pool.name, now)
            for state in ("starting", "warming", "ready", "draining", "restarting", "failed"):
                replicas_g.labels(pool.name, state).set(sum(1 for s in seen if s.report.state == state))
            stale_g.labels(pool.name).set(sum(1 for s in seen if s.stale))
            leases_g.labels(pool.name).set(len(cp.leases.holders(pool.name, now)))
            if cp.loop is not None and pool.name in cp.loop.last:
                target_g.labels(pool.name).set(cp.loop.last[pool.name].target)
        return web.Response(body=generate_latest(cp.metrics), content_type="text/plain", charset="utf-8")

    async def healthz(request: web.Request) -> web.Response:
        del request  # Unused.
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/reports", post_report)
    app.router.add_post("/v1/gateway-reports", post_gateway_report)
    app.router.add_get("/v1/pools", get_pools)
    app.router.add_get("/v1/pools/{pool}/replicas", get_replicas)
    app.router.add_post("/v1/leases/restart", post_lease)
    app.router.add_delete("/v1/leases/restart/{pool}/{replica}", delete_lease)
    app.router.add_get("/v1/leases", get_leases)
    app.router.add_get("/v1/decisions", get_decisions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
