"""API: the agent's own HTTP endpoints (not in the data path; gateways talk to the engine directly).

    GET  /healthz   200 while the agent process is alive
    GET  /readyz    200 only in state ``ready``; 503 otherwise (falls at once when a drain starts)
    GET  /status    JSON: replica, pool, model, engine + version, state, uptime, restarts, engine_url,
                    engine_pid, last load, GPU inventory, recent transitions
    POST /drain     202: readiness off, drain the engine, stop, exit 0
    POST /reset     200: operator reset of a crash-looping (failed) replica; 409 when not failed
    GET  /metrics   Prometheus text (``llmfleet_agent_*``)

Errors use OpenAI's JSON error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from agent.node import Agent

__all__ = ["create_app"]

AGENT_KEY: web.AppKey[Agent] = web.AppKey("agent")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _agent(request: web.Request) -> Agent:
    return request.app[AGENT_KEY]


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "state": _agent(request).supervisor.state.value})


async def readyz(request: web.Request) -> web.Response:
    supervisor = _agent(request).supervisor
    if supervisor.machine.ready:
        return web.json_response({"ready": True, "state": supervisor.state.value})
    return web.json_response({"ready": False, "state": supervisor.state.value}, status=503)


async def status(request: web.Request) -> web.Response:
    return web.json_response(_agent(request).status())


async def drain(request: web.Request) -> web.Response:
    supervisor = _agent(request).supervisor
    accepted = supervisor.request_drain()
    return web.json_response({"accepted": accepted, "state": supervisor.state.value}, status=202)


async def reset(request: web.Request) -> web.Response:
    supervisor = _agent(request).supervisor
    if not supervisor.request_reset():
        return _error(409, f"reset applies to a failed replica; state is {supervisor.state.value}", "conflict")
    return web.json_response({"accepted": True, "state": supervisor.state.value})


async def metrics(request: web.Request) -> web.Response:
    body = _agent(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, f"{exc.reason}: {request.method} {request.path}", "invalid_request_error")


def create_app(agent: Agent) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[AGENT_KEY] = agent
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    app.router.add_post("/drain", drain)
    app.router.add_post("/reset", reset)
    app.router.add_get("/metrics", metrics)
    return app
