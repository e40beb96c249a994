"""App: build the gateway's aiohttp application from settings, with every I/O edge injectable.

    create_app(settings, session_factory=default_session, quota=None, clock=None, tracer_provider=None)
        -> web.Application
    create_admin_app(main) -> web.Application

Public routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /healthz. The admin
application, served on its own port (``gateway.adminPort``, which no public Service exposes), answers GET /healthz,
GET /readyz and GET /metrics for the gateway ``main`` runs: replica counts per pool, tenant names and the
engines' figures never reach the public port. Every response (errors included) carries ``x-request-id``, the
client's when it sent a sane one.
aiohttp serves as well as proxies: measured on this machine it costs a fraction of the CPU per request of an
ASGI stack (see docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from opentelemetry.trace import TracerProvider

from fleet.protocol.clock import Clock, SystemClock
from fleet.protocol.openai_error import error_body
from gateway.alias_sync import AliasSync
from gateway.errors import GatewayError
from gateway.quota import QuotaBackend, quota_backend
from gateway.reporting import GatewayReporter
from gateway.service import REQUEST_ID, Gateway, may_use, may_use_alias, new_request_id
from gateway.settings import GatewaySettings
from gateway.tracing import Tracing

__all__ = ["GATEWAY", "create_admin_app", "create_app", "default_session"]

GATEWAY = web.AppKey("gateway", Gateway)
_MAIN = web.AppKey("main", web.Application)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_session() -> aiohttp.ClientSession:
    """The one pooled upstream client: unlimited connections (admission bounds them), keep-alive reuse."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


@web.middleware
async def _request_id(request: web.Request, handler: Handler) -> web.StreamResponse:
    sent = request.headers.get("x-request-id")
    rid = sent if sent and _REQUEST_ID.match(sent) else new_request_id()
    request[REQUEST_ID] = rid
    try:
        response = await handler(request)
    except GatewayError as exc:
        response = web.Response(status=exc.status, body=exc.body(), content_type="application/json")
        response.headers.update(exc.headers())
    except web.HTTPException as exc:  # unknown path, wrong method
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        response = web.Response(
            status=exc.status, body=error_body(exc.reason, kind, exc.status), content_type="application/json"
        )
        if "Allow" in exc.headers:  # a 405 says which methods the path takes
            response.headers["Allow"] = exc.headers["Allow"]
    if not response.prepared:
        response.headers["x-request-id"] = rid
    return response


def create_app(
    settings: GatewaySettings,
    session_factory: Callable[[], aiohttp.ClientSession] = default_session,
    quota: QuotaBackend | None = None,
    clock: Clock | None = None,
    tracer_provider: TracerProvider | None = None,
) -> web.Application:
    """The application; the upstream session, quota backend, refresh loop and (with a control plane) the
    gateway-report loop (`gateway.reporting`) and the alias-weight sync (`gateway.alias_sync`) start with it and
    stop with it. ``clock`` defaults to the system's.
    ``tracer_provider`` receives the request spans (`gateway.tracing`); None: no spans. Its owner shuts it down."""
    clock = clock or SystemClock()
    app = web.Application(middlewares=[_request_id], client_max_size=settings.spec.gateway.max_body_bytes)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = session_factory()
        backend = quota or quota_backend(settings, clock.monotonic)
        gateway = Gateway(settings, session, backend, clock.monotonic, clock.time, tracing=Tracing(tracer_provider))
        app[GATEWAY] = gateway
        await gateway.refresher.refresh_once()
        tasks = [asyncio.create_task(_refresh_forever(gateway))]
        if settings.control_plane:
            reporter = GatewayReporter(
                settings.control_plane,
                session,
                gateway.admission,
                gateway.traffic,
                clock,
                settings.spec.control_plane.report_interval_s,
                credential=settings.control_credential,
                on_share=gateway.shares.update,
            )
            tasks.append(asyncio.create_task(reporter.run(gateway.cold)))
            aliases = AliasSync(
                settings.control_plane, session, gateway.set_aliases, settings.spec.gateway.routing.scrape_interval_s
            )
            await aliases.sync_once()  # a rollout's weights, not the stack's, from the first request on
            tasks.append(asyncio.create_task(aliases.run()))
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await session.close()
        await backend.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    return app


def create_admin_app(main: web.Application) -> web.Application:
    """The admin listener's application for the gateway that ``main`` (from `create_app`) runs; start it after
    ``main``'s runner is set up (its handlers read ``main``'s gateway)."""
    admin = web.Application(middlewares=[_request_id])
    admin[_MAIN] = main
    admin.router.add_get("/healthz", _healthz)
    admin.router.add_get("/readyz", _readyz)
    admin.router.add_get("/metrics", _metrics)
    return admin


async def _refresh_forever(gateway: Gateway) -> None:
    await asyncio.sleep(gateway.refresher.interval_s)
    await gateway.refresher.run()


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "completion")


async def _models(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    tenant = gateway.keys.authenticate(request.headers.get("Authorization"))
    data = [
        {"id": pool.served_name, "object": "model", "created": 0, "owned_by": "llmfleet", "root": pool.model}
        for pool in gateway.settings.spec.pools
        if may_use(tenant, pool)
    ]
    # An alias is a model like any other to a client; `model` in its answers names the pool that served.
    data += [
        {"id": alias.name, "object": "model", "created": 0, "owned_by": "llmfleet"}
        for alias in gateway.aliases
        if may_use_alias(tenant, alias.name) and alias.name not in {m["id"] for m in data}
    ]
    return web.json_response({"object": "list", "data": data})


async def _healthz(request: web.Request) -> web.StreamResponse:
    del request  # Unused.
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    gateway = request.app[_MAIN][GATEWAY]
    pools = {name: gateway.endpoints.routable(name) for name in gateway.endpoints.pools}
    ready = gateway.refresher.rounds > 0
    return web.json_response({"ready": ready, "routable_replicas": pools}, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    body = request.app[_MAIN][GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
