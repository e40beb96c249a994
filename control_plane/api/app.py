"""App: the control plane's HTTP API (FastAPI), one process per fleet, built from a `ControlPlane`.

    POST   /v1/reports, /v1/gateway-reports   agents' and gateways' reports        (`control_plane.api.reports`)
    GET    /v1/pools, /v1/pools/{pool}/budget, /v1/pools/{pool}/replicas, /v1/decisions
                                              pools, error budgets, discovery and the decision log
                                              (`control_plane.api.pools`)
    POST   /v1/leases/restart, DELETE /v1/leases/restart/{pool}/{replica}, GET /v1/leases
                                              planned-restart leases               (`control_plane.api.leases`)
    GET    /v1/aliases, /v1/rollouts[/{alias}], POST /v1/rollouts, DELETE /v1/rollouts/{alias}
                                              canary rollouts and the alias weights (`control_plane.api.rollouts`)
    GET    /metrics                           Prometheus text                      (`control_plane.api.metrics`)
    GET    /healthz                           200 while the process runs
    GET    /openapi.json, /docs               the OpenAPI document and its browsable page

Bodies are the `fleet.protocol.wire` models. Every error, an invalid body or query included (400, never 422), is
OpenAI's JSON error shape (`fleet.protocol.control_api`); an unknown pool is 404 with ``param: "pool"``. The app
holds no global state: `create_app` builds it from a `ControlPlane`, whose clock is injected. Handlers are
``async`` and run on the event loop, never in a thread pool; the only I/O they do is the lease calls' write to the
lease store (`control_plane.leases.leases`), awaited, and the error budget's read of its counts
(`control_plane.budget.budget`: at most every 15 s, awaited by lease calls and budget reads, in the background on
gateway reports).

Writes need a control credential (`fleet.protocol.control_auth`, given as ``create_app(cp, auth)``): reports from
an agent, gateway reports from a gateway, leases from an agent, rollouts from the control plane's own kind; 401
without a valid one, 403 for another kind. The ``/v1`` reads need a credential of any kind (401 without one): the
replica list names every engine, the decisions, leases and rollouts the fleet's workings. ``/healthz`` stays open
(probes carry no token), and so does ``/metrics`` (Prometheus scrapes it; its series name pools and gateways, never
an engine's address), as do ``/openapi.json`` and ``/docs``. ``ControlAuth(None)`` (the default) accepts every
caller, as ``--auth none`` does.
"""

from __future__ import annotations

from fastapi import FastAPI

from control_plane.api import leases, metrics as metrics_api, pools, reports, rollouts
from control_plane.api.metrics import ControlPlaneMetrics
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import create_control_app, errors
from fleet.protocol.control_auth import ControlAuth

__all__ = ["create_app"]


async def healthz() -> dict[str, str]:
    """200 while the process runs."""
    return {"status": "ok"}


def create_app(cp: ControlPlane, auth: ControlAuth | None = None) -> FastAPI:
    """The FastAPI application serving `cp`; ``auth`` guards the writes (None: open, as ``--auth none``). It
    registers the control plane's series on ``cp.metrics``, so it is built once per control plane."""
    auth = auth or ControlAuth(None)
    app = create_control_app(
        "llmfleet control plane",
        "Load reports from agents and gateways, discovery, restart leases and the scaling decision log.",
    )
    auth.install(app)
    app.state.plane = cp
    app.state.auth = auth
    app.state.metrics = ControlPlaneMetrics.of(cp)
    for resource in (rollouts, reports, pools, leases, metrics_api):
        app.include_router(resource.router)
    app.add_api_route("/healthz", healthz, methods=["GET"], responses=errors())
    return app
