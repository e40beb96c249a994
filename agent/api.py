"""API: the agent's own HTTP endpoints (FastAPI; not in the data path, gateways talk to the engine directly).

    GET  /healthz   200 Health while the agent process is alive
    GET  /readyz    200 Readiness only in state ``ready``; 503 otherwise (falls at once when a drain starts)
    GET  /status    AgentStatus: replica, pool, model, engine + version, state, uptime, restarts, engine_url,
                    engine_pid, last load, GPU inventory, last error, model store fetch, recent transitions
    POST /drain     202 CommandAccepted: readiness off, drain the engine, stop, exit 0
    GET  /prestop   200 CommandAccepted: the same drain, for Kubernetes' preStop ``httpGet`` hook (which can only GET):
                    readiness falls the moment the pod starts terminating, and the kubelet's SIGTERM that follows
                    finds the drain under way, so the propagation delay is waited once, inside the grace
    POST /reset     200 CommandAccepted: operator reset of a crash-looping (failed) replica; 409 when not failed
    POST /sleep     202 CommandAccepted: (``engine.sleepMode``) readiness off, leave routing, sleep the engine at
                    level 1 (`agent.sleeping`); 409 unless ready with sleep mode on
    POST /wake      202 CommandAccepted: wake a sleeping engine and check it, then ready; 409 unless sleeping
    GET  /metrics   Prometheus text (``llmfleet_agent_*``)
    GET  /openapi.json, /docs   the OpenAPI document and its browsable page

Authentication (`fleet.protocol.control_auth`): ``POST /drain``, ``/reset``, ``/sleep`` and ``/wake`` need the
control plane's credential (401 without a valid one, 403 for another kind). ``GET /prestop`` takes the control
plane's credential too, or no credential from loopback, from the pod's own address (the connection's local address)
or from an address in ``prestop_from`` (the node's IP, ``status.hostIP``: the kubelet's preStop ``httpGet`` calls
the pod IP from the node and cannot send a header); anyone else gets 403. ``GET /status`` (it names the engine's
address and pid, the model and the GPUs) takes any fleet member's credential (an agent's, a gateway's or the
control plane's), as the control plane's reads do; the probes and ``/metrics`` stay open (the kubelet and
Prometheus send none). The auth in force is ``create_app``'s ``auth`` argument, else the agent's own
(`Agent.api_auth`, set by the CLI), else none.

Errors (401, 403, 409, unknown route 404, wrong method 405) use OpenAI's JSON error shape
(`fleet.protocol.control_api`).
Handlers only read the agent and call the supervisor's synchronous commands, so they are ``async`` and run on the
agent's event loop. They are module-level, one group per resource (probes, reads, commands); each finds the
agent and the auth in force on ``app.state``, where `create_app` puts them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agent.metrics import AgentMetrics
from agent.status import AgentStatus, Body
from agent.supervisor import Supervisor
from fleet.protocol.control_api import create_control_app, error_response, errors
from fleet.protocol.control_auth import Caller, ControlAuth, ControlAuthError, Kind
from fleet.protocol.wire import AgentState

__all__ = ["AgentHandle", "CommandAccepted", "Health", "Readiness", "create_app"]


class AgentHandle(Protocol):
    """What the API reads of an agent (`agent.node.Agent` is one). The wiring module imports this one, never
    the reverse, so the two form no import circle."""

    @property
    def replica(self) -> str: ...
    @property
    def supervisor(self) -> Supervisor: ...
    @property
    def metrics(self) -> AgentMetrics: ...
    @property
    def api_auth(self) -> ControlAuth | None: ...
    @property
    def prestop_from(self) -> Collection[str]: ...
    def status(self) -> AgentStatus: ...


class Health(Body):
    status: str = "ok"
    state: AgentState


class Readiness(Body):
    ready: bool
    state: AgentState


class CommandAccepted(Body):
    """The answer to a drain or reset: whether it was taken (a second drain is not), and the state now."""

    accepted: bool
    state: AgentState


def _local_caller(request: Request, prestop_from: Collection[str]) -> bool:
    """The caller is this pod (loopback, or the connection's own local address) or one of ``prestop_from``."""
    peer = request.client.host if request.client else ""
    own = request.scope.get("server") or ("", 0)
    try:
        if ipaddress.ip_address(peer).is_loopback:
            return True
    except ValueError:
        return False
    return peer == own[0] or peer in prestop_from


@dataclass(frozen=True)
class _Served:
    """What the handlers read, kept on ``app.state.agent_api``: the agent and the auth in force."""

    agent: AgentHandle
    auth: ControlAuth
    prestop_from: Collection[str]
    control_plane: Callable[[Request], Awaitable[Caller | None]]
    member: Callable[[Request], Awaitable[Caller | None]]  # any fleet member: agent, gateway or control plane


def _served(request: Request) -> _Served:
    served: _Served = request.app.state.agent_api
    return served


def _supervisor(request: Request) -> Supervisor:
    return _served(request).agent.supervisor


_SupervisorArg = Annotated[Supervisor, Depends(_supervisor)]


def create_app(agent: AgentHandle, auth: ControlAuth | None = None, prestop_from: Collection[str] = ()) -> FastAPI:
    """The FastAPI application serving ``agent`` (``auth`` None: the agent's ``api_auth``, else open)."""
    auth = auth or agent.api_auth or ControlAuth(None)
    app = create_control_app(
        f"llmfleet agent {agent.replica}",
        "One replica's agent: health, readiness, status, drain, reset, sleep, wake and metrics.",
    )
    auth.install(app)
    members = auth.require(Kind.AGENT, Kind.GATEWAY, Kind.CONTROL_PLANE)
    prestop = prestop_from or agent.prestop_from
    app.state.agent_api = _Served(agent, auth, prestop, auth.require(Kind.CONTROL_PLANE), members)
    _add_probe_routes(app)
    _add_read_routes(app)
    _add_command_routes(app)
    return app


# ---- probes: /healthz, /readyz ----------------------------------------------------------------------------


async def healthz(supervisor: _SupervisorArg) -> Health:
    """200 while the agent process is alive."""
    return Health(state=supervisor.state.value)


async def readyz(supervisor: _SupervisorArg) -> Readiness | JSONResponse:
    """200 only in state ``ready``; 503 otherwise (it falls the moment a drain starts)."""
    if supervisor.machine.ready:
        return Readiness(ready=True, state=supervisor.state.value)
    body = Readiness(ready=False, state=supervisor.state.value)
    return JSONResponse(body.model_dump(mode="json"), status_code=503)


def _add_probe_routes(app: FastAPI) -> None:
    app.add_api_route("/healthz", healthz, methods=["GET"], response_model=Health, responses=errors())
    app.add_api_route(
        "/readyz",
        readyz,
        methods=["GET"],
        response_model=Readiness,
        responses={503: {"model": Readiness}, **errors()},
    )


# ---- reads: /status, /metrics -----------------------------------------------------------------------------


async def status(request: Request) -> AgentStatus:
    """The replica's identity, engine, state, load, GPUs and recent transitions."""
    return _served(request).agent.status()


async def metrics(request: Request) -> Response:
    """Prometheus text (``llmfleet_agent_*``)."""
    return Response(_served(request).agent.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _member_caller(request: Request) -> Caller | None:
    return await _served(request).member(request)


def _add_read_routes(app: FastAPI) -> None:
    app.add_api_route(
        "/status",
        status,
        methods=["GET"],
        response_model=AgentStatus,
        response_model_by_alias=True,
        responses=errors(401, 403),
        dependencies=[Depends(_member_caller)],
    )
    app.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        response_class=PlainTextResponse,
        responses=errors(plain_text=True),
    )


# ---- commands: /drain, /prestop, /reset (the control plane's credential) ----------------------------------


async def _control_plane_caller(request: Request) -> Caller | None:
    return await _served(request).control_plane(request)


async def _prestop_caller(request: Request) -> Caller | None:
    """No credential from this pod or its node; else the control plane's."""
    served = _served(request)
    if served.auth.verifier is None or (
        request.headers.get("authorization") is None and _local_caller(request, served.prestop_from)
    ):
        return None
    if request.headers.get("authorization") is None:
        raise ControlAuthError(403, "/prestop takes no credential only from this pod or its node")
    return await served.control_plane(request)


async def drain(supervisor: _SupervisorArg) -> CommandAccepted:
    """Readiness off now, then drain the engine, stop it and exit 0. ``accepted`` is False when already
    stopping."""
    accepted = supervisor.request_drain()
    return CommandAccepted(accepted=accepted, state=supervisor.state.value)


async def prestop(supervisor: _SupervisorArg) -> CommandAccepted:
    """Kubernetes preStop hook: start the drain now (as ``POST /drain``) and answer at once."""
    accepted = supervisor.request_drain()
    return CommandAccepted(accepted=accepted, state=supervisor.state.value)


async def reset(supervisor: _SupervisorArg) -> CommandAccepted | JSONResponse:
    """Operator reset of a crash-looping replica: restarts resume. 409 unless the replica is failed."""
    if not supervisor.request_reset():
        return error_response(409, f"reset applies to a failed replica; state is {supervisor.state.value}")
    return CommandAccepted(accepted=True, state=supervisor.state.value)


async def sleep(supervisor: _SupervisorArg) -> CommandAccepted | JSONResponse:
    """Sleep mode: readiness off now, then leave routing and sleep the engine at level 1. 409 unless the replica
    is ready and its pool has ``engine.sleepMode``."""
    if not supervisor.pool.engine.sleep_mode:
        return error_response(409, f"pool {supervisor.pool.name} has engine.sleepMode off")
    if not supervisor.request_sleep():
        return error_response(409, f"sleep applies to a ready replica; state is {supervisor.state.value}")
    return CommandAccepted(accepted=True, state=supervisor.state.value)


async def wake(supervisor: _SupervisorArg) -> CommandAccepted | JSONResponse:
    """Wake a sleeping engine; ready again once its check answers as before the sleep. 409 unless sleeping."""
    if not supervisor.request_wake():
        return error_response(409, f"wake applies to a sleeping replica; state is {supervisor.state.value}")
    return CommandAccepted(accepted=True, state=supervisor.state.value)


def _add_command_routes(app: FastAPI) -> None:
    control_plane_only = [Depends(_control_plane_caller)]
    for path, handler in (("/sleep", sleep), ("/wake", wake)):
        app.add_api_route(
            path,
            handler,
            methods=["POST"],
            status_code=202,
            response_model=CommandAccepted,
            responses=errors(401, 403, 409),
            dependencies=control_plane_only,
        )
    app.add_api_route(
        "/drain",
        drain,
        methods=["POST"],
        status_code=202,
        response_model=CommandAccepted,
        responses=errors(401, 403),
        dependencies=control_plane_only,
    )
    app.add_api_route(
        "/prestop",
        prestop,
        methods=["GET"],
        response_model=CommandAccepted,
        responses=errors(401, 403),
        dependencies=[Depends(_prestop_caller)],
    )
    app.add_api_route(
        "/reset",
        reset,
        methods=["POST"],
        response_model=CommandAccepted,
        responses=errors(401, 403, 409),
        dependencies=control_plane_only,
    )
