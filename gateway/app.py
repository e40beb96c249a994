"""App: build the gateway's aiohttp application from settings, with every I/O edge injectable.

    create_app(settings, session_factory=default_session, quota=None, clock=None, tracer_provider=None)
        -> web.Application
    create_admin_app(main) -> web.Application
    build_gateway(settings, session, quota, clock, tracing) -> Gateway

This is the one module that knows every part: `build_gateway` builds each of them (the metrics, the key ring, the
models, admission, the endpoint set and its routers behind the `Upstream`, the refresher) and hands them to the
`Gateway`, which builds nothing; the application's lifecycle starts and stops the background loops.

Public routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings (to pools with
``engine.runner: pooling`` only), POST /v1/responses with GET /v1/responses/{id} and POST
/v1/responses/{id}/cancel (`gateway.held_responses`), Anthropic's POST /v1/messages (`gateway.dialects`),
GET /v1/models, GET /healthz (`gateway.routes`). The admin
application, served on its own port (``gateway.adminPort``, which no public Service exposes), answers GET /healthz,
GET /readyz and GET /metrics for the gateway ``main`` runs: replica counts per pool, tenant names and the
engines' figures never reach the public port. No other path is forwarded: the engines' development endpoints
(`ENGINE_DEV_PATHS`: sleep, wake, RPC, cache and pause control, which vLLM's ``--api-key`` does not guard) answer
404 for every method, on an explicit route, so that no later catch-all can start forwarding them.
Every response (errors included) carries ``x-request-id``, the client's when it sent a sane one. Both applications
refuse malformed headers before any route runs (`gateway.edge.header_guard`) and answer unknown paths (404) and
methods (405, with Allow) as OpenAI error JSON, like every other error; their listeners run under
`gateway.edge.EdgeRunner`, which does the same for what aiohttp refuses before the application sees it.
aiohttp serves as well as proxies: measured on this machine it costs a fraction of the CPU per request of an
ASGI stack (see docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from opentelemetry.trace import TracerProvider

from fleet.capacity.plan import admission_capacity
from fleet.protocol.clock import Clock, SystemClock
from fleet.protocol.openai_error import error_body
from fleet.slo.rules import ttft_slo_edges
from fleet.spec.stack import PluginRef
from gateway.admission import Admission
from gateway.alias_sync import AliasSync
from gateway.auth import KeyRing
from gateway.call import REQUEST_ID, request_id_for
from gateway.dialects import ANTHROPIC_PATHS, anthropic_error_body
from gateway.drain import DRAIN
from gateway.edge import METRICS, error_response, header_guard
from gateway.endpoints import Endpoint, EndpointSet, Refresher
from gateway.errors import GatewayError
from gateway.kv_events import KvEventFeed
from gateway.metrics import AccessLog, GatewayMetrics
from gateway.models import Models
from gateway.prompt_tokens import PromptTokens
from gateway.proxy import Timeouts
from gateway.quota import QuotaBackend, quota_backend
from gateway.reporting import GatewayReporter, PoolTraffic
from gateway.response_ids import ResponseIds
from gateway.retries import RetryBudget
from gateway.routes import ENGINE_DEV_PATHS, GATEWAY, add_public_routes, healthz
from gateway.routing.aliases import AliasTable
from gateway.routing.base import Router
from gateway.routing.scorers.kv_cache import KvCache
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.shares import CapacityShares
from gateway.tracing import Tracing
from gateway.upstream import Upstream

__all__ = ["ENGINE_DEV_PATHS", "GATEWAY", "build_gateway", "create_admin_app", "create_app", "default_session"]

UPSTREAM_KEEPALIVE_S = 4.0  # below vLLM's default 5 s keep-alive (vllm/envs.py, VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
_MAIN = web.AppKey("main", web.Application)
_SESSION_HEADER = web.AppKey("session_header", str)  # read by both listeners' header guards

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_session() -> aiohttp.ClientSession:
    """The one pooled upstream client: unlimited connections (admission bounds them), keep-alive reuse.

    An idle pooled connection is dropped after `UPSTREAM_KEEPALIVE_S`, before the engine's own keep-alive timeout
    closes it: vLLM's API server closes an idle connection after 5 s (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``), and a
    request sent on a connection the engine is closing fails with "Server disconnected" (seen on real vLLM).
    """
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=UPSTREAM_KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


@web.middleware
async def _request_id(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = request_id_for(request.headers.get("x-request-id"))
    request[REQUEST_ID] = rid
    try:
        response = await handler(request)
    except GatewayError as exc:
        return await error_response(request, exc, rid)
    except web.HTTPException as exc:  # unknown path, wrong method
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        body = error_body(exc.reason, kind, exc.status)
        if request.path.startswith(ANTHROPIC_PATHS):
            body = anthropic_error_body(exc.reason, exc.status)
        response = web.Response(status=exc.status, body=body, content_type="application/json")
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
    guard = header_guard(settings.spec.gateway.session_header)
    app = web.Application(middlewares=[_request_id, guard], client_max_size=settings.spec.gateway.max_body_bytes)
    app[_SESSION_HEADER] = settings.spec.gateway.session_header

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = session_factory()
        backend = quota or quota_backend(settings, clock)
        gateway = build_gateway(settings, session, backend, clock, Tracing(tracer_provider))
        app[GATEWAY] = gateway
        app[METRICS] = gateway.metrics
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
                on_peers=gateway.quota.peers,
            )
            tasks.append(asyncio.create_task(reporter.run(gateway.cold)))
            aliases = _alias_sync(settings, settings.control_plane, session, gateway.set_aliases)
            await aliases.sync_once()  # a rollout's weights, not the stack's, from the first request on
            tasks.append(asyncio.create_task(aliases.run()))
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await gateway.kv_feed.close()
        await session.close()
        await backend.close()

    app.cleanup_ctx.append(lifecycle)
    add_public_routes(app)
    return app


def build_gateway(
    settings: GatewaySettings, session: aiohttp.ClientSession, quota: QuotaBackend, clock: Clock, tracing: Tracing
) -> Gateway:
    """Every part of one gateway process, from ``settings``, over the upstream ``session`` and ``quota``."""
    spec, config = settings.spec, settings.spec.gateway
    metrics = GatewayMetrics(ttft_slo_s=ttft_slo_edges(spec))
    metrics.watch_quota(quota)  # the quota store's health, when the backend has a shared store
    metrics.start_at_zero([t.name for t in spec.tenants], [p.served_name for p in spec.pools])
    queue = config.queue
    cold = asyncio.Event()
    admission = {
        p.name: Admission(queue.max_waiting, queue.timeout_s, clock, queue.hold_for_capacity_s, cold.set)
        for p in spec.pools
    }

    # Admission admits this gateway's share of the routable replicas' slots; a wait for replicas ends early.
    # Runs only after every part below exists: none of them calls it while being built.
    def capacity_changed(pool: str) -> None:
        routable = endpoints.routable(pool)
        capacity = admission_capacity(routable, spec.pool(pool).engine.max_num_seqs, queue.per_replica_threshold)
        if pool in admission:  # a prefill role pool admits nothing: its pool's requests were admitted
            admission[pool].set_capacity(shares.capacity(pool, capacity))
        metrics.child(metrics.ready, pool).set(routable)
        upstream.changed(pool)

    shares = CapacityShares(  # this gateway's part of each pool's capacity, as the control plane divides it
        controlled=settings.control_plane is not None,
        floor=1.0 / config.replicas,
        hold_s=spec.control_plane.stale_after_s,
        clock=clock,
        on_change=capacity_changed,
    )
    ejected = functools.partial(_count_ejection, metrics)
    endpoints = EndpointSet(spec.engine_pools, clock, on_change=capacity_changed, on_eject=ejected)
    upstream = _upstream(settings, endpoints, session, metrics, clock)
    kv_feed = KvEventFeed({name: kv_scorers(router) for name, router in upstream.routers.items()})
    metrics.watch_kv(kv_feed)
    return Gateway(
        config=config,
        keys=KeyRing(spec.tenants, settings.extra_keys, settings.extra_hashes),
        models=Models(spec.pools, AliasTable.from_spec(spec.aliases), lambda pool: endpoints.routable(pool) > 0),
        quota=quota,
        admission=admission,
        traffic={p.name: PoolTraffic() for p in spec.pools},
        upstream=upstream,
        metrics=metrics,
        tracing=tracing,
        access_log=AccessLog() if settings.access_log else None,
        clock=clock,
        engine_api_key=settings.engine_api_key,
        dynamic=settings.control_plane is not None,
        refresher=_refresher(settings, endpoints, session, kv_feed),
        shares=shares,
        cold=cold,
        prompt_tokens=_prompt_tokens(settings, kv_feed, metrics),
        kv_feed=kv_feed,
        response_ids=ResponseIds.from_engine_key(settings.engine_api_key),
    )


def _count_ejection(metrics: GatewayMetrics, ep: Endpoint, backoff_s: float) -> None:
    del backoff_s  # Unused.
    metrics.child(metrics.ejections, ep.pool, ep.id).inc()


def kv_scorers(router: Router) -> list[KvCache]:
    """The router's kv-cache scorers: their indexes need the KV event feed, their requests the prompt's tokens."""
    return [scorer for scorer, _ in router.scorers if isinstance(scorer, KvCache)]


def _prompt_tokens(settings: GatewaySettings, kv_feed: KvEventFeed, metrics: GatewayMetrics) -> PromptTokens:
    """The tokenizers of the pools routed by kv-cache (their folder, else the model store's, `settings.tokenizers`);
    ``prompt_tokens_available{pool}`` says which pools have one."""
    pools = [p for p in settings.spec.pools if kv_feed.pools.get(p.name)]
    tokens = PromptTokens(pools, settings.tokenizers)
    for pool in pools:
        metrics.child(metrics.prompt_tokens, pool.name).set(1 if pool.name in tokens else 0)
    return tokens


def _upstream(
    settings: GatewaySettings,
    endpoints: EndpointSet,
    session: aiohttp.ClientSession,
    metrics: GatewayMetrics,
    clock: Clock,
) -> Upstream:
    config = settings.spec.gateway
    t, retries = config.timeouts, config.retries
    timeouts = Timeouts(t.connect_s, t.first_token_s, t.total_s)
    budget = RetryBudget(retries.budget_fraction)
    routers = _routers(settings, metrics)
    metrics.watch_endpoints(endpoints)  # the token counts each attempt keeps on its replica (least-work's)
    return Upstream(endpoints, routers, session, timeouts, budget, retries.max_attempts, metrics, clock)


def _routers(settings: GatewaySettings, metrics: GatewayMetrics) -> dict[str, Router]:
    """One router per pool from ``gateway.routing``; the not-ejected filter always among the filters."""
    routing = settings.spec.gateway.routing
    filters = list(routing.filters)
    if "not-ejected" not in {f.name for f in filters}:
        filters.append(PluginRef(name="not-ejected"))
    picker = routing.picker
    if settings.routing_seed is not None and "seed" not in picker.params:
        params = {**picker.params, "seed": settings.routing_seed}
        picker = PluginRef(name=picker.name, weight=picker.weight, params=params)
    timing = metrics.plugin
    return {
        p.name: Router.from_refs(filters, routing.scorers, picker, lambda n, s: timing.labels(n).observe(s))
        for p in settings.spec.engine_pools  # a prefill role pool's leg is routed by the same plugins
    }


def _alias_sync(
    settings: GatewaySettings,
    control_plane: str,
    session: aiohttp.ClientSession,
    apply: Callable[[AliasTable], None],
) -> AliasSync:
    """The alias-weight sync, reading with the gateway's control credential every ``routing.scrapeIntervalS``."""
    interval_s = settings.spec.gateway.routing.scrape_interval_s
    return AliasSync(control_plane, session, apply, interval_s, credential=settings.control_credential)


def _refresher(
    settings: GatewaySettings, endpoints: EndpointSet, session: aiohttp.ClientSession, kv_feed: KvEventFeed
) -> Refresher:
    interval_s = settings.spec.gateway.routing.scrape_interval_s
    return Refresher(
        endpoints,
        session,
        {p.name: settings.replicas_of(p.name) for p in settings.spec.engine_pools},
        settings.control_plane,
        interval_s,
        timeout_s=max(0.25, min(2.0, interval_s * 2)),
        kv_feed=kv_feed,
        static_kv=settings.static_kv_events,
        credential=settings.control_credential,
    )


def create_admin_app(main: web.Application) -> web.Application:
    """The admin listener's application for the gateway that ``main`` (from `create_app`) runs; start it after
    ``main``'s runner is set up (its handlers read ``main``'s gateway)."""
    admin = web.Application(middlewares=[_request_id, header_guard(main[_SESSION_HEADER])])
    admin[_MAIN] = main
    admin.on_startup.append(_share_metrics)
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", _readyz)
    admin.router.add_get("/metrics", _metrics)
    return admin


async def _share_metrics(admin: web.Application) -> None:
    admin[METRICS] = admin[_MAIN][METRICS]  # the admin listener's client errors count with the public one's


async def _refresh_forever(gateway: Gateway) -> None:
    await asyncio.sleep(gateway.refresher.interval_s)
    await gateway.refresher.run()


async def _readyz(request: web.Request) -> web.StreamResponse:
    main = request.app[_MAIN]
    gateway = main[GATEWAY]
    pools = {name: gateway.endpoints.routable(name) for name in gateway.endpoints.pools}
    drain = main.get(DRAIN)
    draining = drain is not None and drain.started
    ready = gateway.refresher.rounds > 0 and not draining
    body = {"ready": ready, "draining": draining, "routable_replicas": pools}
    return web.json_response(body, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    body = request.app[_MAIN][GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
