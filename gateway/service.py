"""Service: one request's life in the gateway: auth -> quota -> admission -> route -> proxy, with retries.

Retries happen only before the first byte reached the client, only for retryable failures (`UpstreamError`
``retryable``), always on a replica not tried yet, at most ``retries.maxAttempts`` attempts and only while the
`RetryBudget` allows. After the first byte a stream belongs to `gateway.streams.StreamSession`: a failure ends it
with an SSE error event and ``[DONE]``, or, in a pool that resumes streams, continues it on another replica.
The quota reservation is settled in every path: the engine's usage when known, the relayed events otherwise,
nothing when no engine ran the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from fleet.capacity.plan import admission_capacity
from fleet.slo.rules import ttft_slo_edges
from fleet.spec.stack import PluginRef, PoolSpec, TenantSpec
from gateway.auth import FORWARDED_HEADERS, KeyRing
from gateway.body import Kind, ParsedRequest, parse_body
from gateway.endpoints import Endpoint, EndpointSet, Refresher
from gateway.errors import (
    BadRequest,
    BodyTooLarge,
    GatewayError,
    GatewayTimeout,
    ModelNotAllowed,
    ModelNotFound,
    NoReadyReplica,
    RequestTimeout,
    ServiceUnavailable,
    UnsupportedMediaType,
    UpstreamConnectError,
    UpstreamError,
    UpstreamFailed,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.metrics import AccessLog, GatewayMetrics
from gateway.outcome import Outcome, record
from gateway.proxy import Timeouts, open_stream, send_json
from gateway.quota.base import QuotaBackend, QuotaLimits, check_fits
from gateway.retries import RetryBudget
from gateway.routing.aliases import AliasTable, WeightedAlias
from gateway.routing.base import EndpointView, RequestInfo, Router
from gateway.settings import GatewaySettings
from gateway.streams import Segment, StreamSession
from gateway.tracing import RequestSpans, Tracing
from gateway.upstream import Attempt

__all__ = ["REQUEST_ID", "Attempt", "Gateway", "Outcome", "may_use", "may_use_alias"]

REQUEST_ID = web.RequestKey("request_id", str)

log = logging.getLogger("llmfleet.gateway")


class Gateway:
    """All gateway state for one process, built by `gateway.app.create_app`."""

    def __init__(
        self,
        settings: GatewaySettings,
        session: aiohttp.ClientSession,
        quota: QuotaBackend,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        metrics: GatewayMetrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        spec = settings.spec
        self.settings = settings
        self.config = spec.gateway
        self.session = session
        self.quota = quota
        self.clock = clock
        self.wall = wall
        self.metrics = metrics or GatewayMetrics(ttft_slo_s=ttft_slo_edges(spec))
        self.tracing = tracing or Tracing()  # no provider: no-op spans
        self.metrics.watch_quota(quota)  # the quota store's health, when the backend has a shared store
        self.metrics.start_at_zero([t.name for t in spec.tenants], [p.served_name for p in spec.pools])
        self.access_log = AccessLog() if settings.access_log else None
        self.keys = KeyRing(spec.tenants, settings.extra_keys, settings.extra_hashes)
        self.pools: dict[str, PoolSpec] = {}
        for pool in spec.pools:
            self.pools.setdefault(pool.model, pool)
        self.pools.update({p.served_name: p for p in spec.pools})
        self.adapter_pools = {a.name: p for p in spec.pools for a in p.adapters}  # LoRA adapter -> its pool
        self.aliases = AliasTable()
        self.set_aliases(AliasTable.from_spec(spec.aliases))
        self.dynamic = settings.control_plane is not None
        self._changes: dict[str, asyncio.Event] = {}  # set, then replaced, when a pool's replicas change
        from gateway.admission import Admission  # local: keeps this module's import list about the request path

        queue = self.config.queue
        self.cold = asyncio.Event()  # set when a request waits for a pool with no capacity: report at once
        self.admission = {
            p.name: Admission(queue.max_waiting, queue.timeout_s, clock, queue.hold_for_capacity_s, self.cold.set)
            for p in spec.pools
        }
        from gateway.reporting import PoolTraffic

        self.traffic = {p.name: PoolTraffic() for p in spec.pools}  # reported to the control plane
        from gateway.shares import CapacityShares

        self.shares = CapacityShares(  # this gateway's part of each pool's capacity, as the control plane divides it
            controlled=self.dynamic,
            floor=1.0 / self.config.replicas,
            hold_s=spec.control_plane.stale_after_s,
            clock=clock,
            on_change=self._capacity_changed,
        )
        self.endpoints = EndpointSet(spec.pools, clock, on_change=self._capacity_changed, on_eject=self._ejected)
        routing = self.config.routing
        filters = list(routing.filters)
        if "not-ejected" not in {f.name for f in filters}:
            filters.append(PluginRef(name="not-ejected"))
        picker = routing.picker
        if settings.routing_seed is not None and "seed" not in picker.params:
            params = {**picker.params, "seed": settings.routing_seed}
            picker = PluginRef(name=picker.name, weight=picker.weight, params=params)
        timing = self.metrics.plugin
        self.routers = {
            p.name: Router.from_refs(filters, routing.scorers, picker, lambda n, s: timing.labels(n).observe(s))
            for p in spec.pools
        }
        self.refresher = Refresher(
            self.endpoints,
            session,
            {p.name: settings.replicas_of(p.name) for p in spec.pools},
            settings.control_plane,
            routing.scrape_interval_s,
            timeout_s=max(0.25, min(2.0, routing.scrape_interval_s * 2)),
        )
        self.budget = RetryBudget(self.config.retries.budget_fraction)
        t = self.config.timeouts
        self.timeouts = Timeouts(t.connect_s, t.first_token_s, t.total_s)

    # -- capacity and health -------------------------------------------------------------------------------
    def _capacity_changed(self, pool: str) -> None:
        spec = self.settings.spec.pool(pool)
        routable = self.endpoints.routable(pool)
        capacity = admission_capacity(routable, spec.engine.max_num_seqs, self.config.queue.per_replica_threshold)
        self.admission[pool].set_capacity(self.shares.capacity(pool, capacity))
        self.metrics.child(self.metrics.ready, pool).set(routable)
        changed = self._changes.pop(pool, None)
        if changed is not None:
            changed.set()

    async def pool_changed(self, pool: str, timeout_s: float) -> None:
        """Return when ``pool``'s replicas may have changed (membership, readiness, ejection, or a refresh round),
        or after ``timeout_s``."""
        changed = self._changes.setdefault(pool, asyncio.Event())
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            pass

    def _ejected(self, ep: Endpoint, backoff_s: float) -> None:
        del backoff_s  # Unused.
        self.metrics.child(self.metrics.ejections, ep.pool, ep.id).inc()

    def account(self, ep: Endpoint, exc: UpstreamError) -> None:
        """Health bookkeeping for a failed attempt: readiness for refusals, outlier ejection for replica faults."""
        if isinstance(exc, UpstreamUnavailable | UpstreamConnectError):
            self.endpoints.set_ready(ep, False)  # out of rotation until its next good probe
        if exc.replica_fault:
            self.endpoints.failed(ep, eject_now=isinstance(exc, UpstreamTimeout))

    def set_aliases(self, table: AliasTable) -> None:
        """Serve ``table``'s aliases from now on (requests already routed keep their pool); ValueError, and the
        current table kept, when it names a pool this gateway does not know."""
        known = {p.name for p in self.settings.spec.pools}
        unknown = sorted({p for alias in table for p in alias.pools} - known)
        if unknown:
            raise ValueError(f"aliases name unknown pools {unknown}; pools: {', '.join(sorted(known))}")
        self.aliases = table

    # -- request path --------------------------------------------------------------------------------------
    def resolve(self, model: str, tenant: TenantSpec, info: RequestInfo) -> tuple[PoolSpec, WeightedAlias | None]:
        """The pool that serves ``model``, and the alias it came through: an alias's pool for the request ``info``
        (`AliasTable.resolve`, preferring pools with a ready replica), else the pool serving that name."""
        alias = self.aliases.get(model)
        if alias is not None:
            if not may_use_alias(tenant, alias.name):
                raise ModelNotAllowed(f"tenant '{tenant.name}' may not use model '{model}'", param="model")
            chosen = self.aliases.resolve(alias, info, lambda pool: self.endpoints.routable(pool) > 0)
            return self.settings.spec.pool(chosen), alias
        pool = self.pools.get(model)
        if pool is None and model in self.adapter_pools:  # a LoRA adapter: allowed by its own name, not its base's
            if not ("*" in tenant.allowed_models or model in tenant.allowed_models):
                raise ModelNotAllowed(f"tenant '{tenant.name}' may not use model '{model}'", param="model")
            return self.adapter_pools[model], None
        if pool is None:
            raise ModelNotFound(f"the model '{model}' does not exist", param="model")
        if not may_use(tenant, pool):
            raise ModelNotAllowed(f"tenant '{tenant.name}' may not use model '{model}'", param="model")
        return pool, None

    async def read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds {limit}")
        try:
            async with asyncio.timeout(self.config.timeouts.body_read_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"request body exceeds {limit} bytes") from None
        except RequestPayloadError as exc:
            raise BadRequest("the request body cannot be read: it does not match its Content-Encoding") from exc
        except TimeoutError:
            raise RequestTimeout(
                f"the request body did not arrive within {self.config.timeouts.body_read_s:g}s"
            ) from None

    async def complete(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        out = Outcome(request_id=request[REQUEST_ID], received=self.clock())
        wall = self.wall()
        spans = self.tracing.start(request.method, request.path, kind, request.headers, out.request_id)
        try:
            response = await self._complete(request, kind, out, spans)
            # A stream that failed after its first byte went out as 200 with an error event; the SLOs count it as
            # what it was: an engine failure, or the client's error when the engine said so.
            out.status = out.stream_status or response.status
            return response
        except GatewayError as exc:
            out.status, out.error = exc.status, exc.code
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            out.status, out.error = 499, "client_closed"
            raise
        finally:
            self._record(out, wall)
            spans.finish(out)

    async def _complete(
        self, request: web.Request, kind: Kind, out: Outcome, spans: RequestSpans
    ) -> web.StreamResponse:
        with spans.phase("auth") as span:
            tenant = self.keys.authenticate(_authorization(request))
            span.set_attribute("llmfleet.tenant", tenant.name)
        out.tenant = tenant.name
        if request.content_type != "application/json":
            raise UnsupportedMediaType(
                f"Content-Type must be application/json, got {request.content_type!r}", param="Content-Type"
            )
        parsed = parse_body(await self.read_body(request), kind)
        out.stream = parsed.stream
        pool, alias = self.resolve(parsed.model, tenant, self._request_info(request, parsed, tenant, out, parsed.model))
        out.model = pool.served_name  # never the client's string: metric labels stay bounded
        out.pool = pool.name
        if parsed.model in self.adapter_pools:
            out.adapter = parsed.model
        if alias is not None:
            out.alias = alias.name
            self.metrics.child(self.metrics.alias_routed, alias.name, pool.name).inc()
        spans.annotate({"llmfleet.pool": pool.name, "llmfleet.priority": tenant.priority})
        with spans.phase("quota", {"llmfleet.tenant": tenant.name}):
            limits = QuotaLimits.of(tenant)
            check_fits(limits, parsed.reserve_tokens)
            # The concurrency slot is keyed by an id the gateway makes: the client's x-request-id is only echoed
            # and logged, so requests sharing one cannot share a slot.
            reservation = await self.quota.acquire(tenant.name, limits, new_request_id(), parsed.reserve_tokens)
        try:
            if not self.dynamic and self.endpoints.routable(pool.name) == 0:
                raise _no_ready_replica(pool)
            admission, traffic = self.admission[pool.name], self.traffic[pool.name]
            self.metrics.child(self.metrics.queue_depth, pool.served_name).set(admission.waiting + 1)
            traffic.arrived += 1
            try:
                with spans.phase("queued", {"llmfleet.priority": tenant.priority}):
                    slot = await admission.acquire(tenant.name, tenant.priority)
            finally:
                self.metrics.child(self.metrics.queue_depth, pool.served_name).set(admission.waiting)
            traffic.admitted += 1
            out.queued_s = slot.waited_s
            self.metrics.child(self.metrics.queue_wait, pool.served_name, str(tenant.priority)).observe(slot.waited_s)
            try:
                return await self._attempts(request, parsed, pool, tenant, out, spans)
            finally:
                slot.release()
        finally:
            await self.quota.release(reservation, out.used_tokens)

    def _upstream_headers(self, request: web.Request, request_id: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "x-request-id": request_id}
        if self.settings.engine_api_key:  # engines refuse anyone else: the gateway is the only way in
            headers["Authorization"] = f"Bearer {self.settings.engine_api_key}"
        for name in FORWARDED_HEADERS[1:]:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        return headers

    def _request_info(
        self, request: web.Request, parsed: ParsedRequest, tenant: TenantSpec, out: Outcome, model: str
    ) -> RequestInfo:
        return RequestInfo(
            request_id=out.request_id,
            model=model,
            tenant=tenant.name,
            priority=tenant.priority,
            prompt=parsed.prompt,
            session_id=request.headers.get(self.config.session_header),
            now=self.clock(),
            adapter=out.adapter,
        )

    async def _attempts(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        pool: PoolSpec,
        tenant: TenantSpec,
        out: Outcome,
        spans: RequestSpans,
    ) -> web.StreamResponse:
        info = self._request_info(request, parsed, tenant, out, pool.served_name)
        body = parsed.upstream_body(out.adapter or pool.served_name)
        headers = self._upstream_headers(request, out.request_id)
        path = "/v1/chat/completions" if parsed.kind == "chat" else "/v1/completions"
        router = self.routers[pool.name]
        tried: set[str] = set()
        retry_reason: str | None = None  # the failure that sent the request to its next replica
        self.budget.on_request()
        while True:
            with spans.phase("route", {"llmfleet.routing.picker": router.picker.name}) as span:
                decision = router.route([v for v in self.endpoints.snapshot(pool.name) if v.id not in tried], info)
                if decision is None:
                    raise _no_ready_replica(pool)
                span.set_attributes(
                    {"llmfleet.replica": decision.endpoint.id, "llmfleet.routing.candidates": decision.candidates}
                )
            tried.add(decision.endpoint.id)
            attempt = self.begin_attempt(decision.endpoint, pool, out)
            out.routed_s = self.clock() - out.received
            ep = attempt.ep
            try:
                if parsed.stream:
                    deadline = asyncio.get_running_loop().time() + self.timeouts.total_s
                    with spans.upstream(ep.id, pool.name, ep.url, out.attempts, retry_reason) as span:
                        relay, first = await open_stream(
                            self.session,
                            ep.url + path,
                            body,
                            spans.headers_for(span, headers),
                            self.timeouts,
                            hide_usage=not parsed.client_wants_usage,
                        )
                    # From here on bytes reach the client: the session owns the attempt, no retry.
                    session = StreamSession(self, request, parsed, pool, info, path, body, headers, out, spans)
                    return await session.run(Segment(attempt, relay, first), deadline)
                with spans.upstream(ep.id, pool.name, ep.url, out.attempts, retry_reason) as span:
                    answer = await send_json(
                        self.session, ep.url + path, body, spans.headers_for(span, headers), self.timeouts
                    )
                self.endpoints.succeeded(ep)
                out.prompt_tokens = answer.usage.prompt_tokens
                out.completion_tokens = answer.usage.completion_tokens
                out.used_tokens = _used(parsed, out.prompt_tokens, out.completion_tokens)
                out.first_token_s = self.clock() - out.received
                return web.Response(
                    status=200,
                    body=answer.body,
                    headers={"Content-Type": answer.content_type, "x-llmfleet-replica": ep.id},
                )
            except UpstreamStatus as exc:
                self.account(ep, exc)
                return web.Response(status=exc.status, body=exc.body, headers={"Content-Type": exc.content_type})
            except UpstreamError as exc:
                self.account(ep, exc)
                if exc.retryable and out.attempts < self.config.retries.max_attempts and self.budget.try_spend():
                    self.metrics.child(self.metrics.retries, pool.served_name, type(exc).__name__).inc()
                    retry_reason = type(exc).__name__
                    log.info("retrying %s on another replica after %s from %s", out.request_id, exc, ep.id)
                    continue
                log.warning("%s failed on %s: %s", out.request_id, ep.id, exc)
                raise _client_error(exc) from exc
            finally:
                attempt.close()

    def begin_attempt(self, view: EndpointView, pool: PoolSpec, out: Outcome) -> Attempt:
        """Lease the replica behind ``view`` (a router's pick from a snapshot with no await since) for one attempt."""
        return Attempt(self.endpoints, self.metrics, self.clock, view, pool, out)

    # -- bookkeeping ---------------------------------------------------------------------------------------
    def _record(self, out: Outcome, wall: float) -> None:
        out.done_s = self.clock() - out.received
        traffic = self.traffic[out.pool] if out.pool is not None else None
        record(out, wall, self.metrics, traffic, self.access_log)


def may_use(tenant: TenantSpec, pool: PoolSpec) -> bool:
    """Whether the tenant's ``allowedModels`` admit the pool (by served name or model, or ``*``)."""
    allowed = tenant.allowed_models
    return "*" in allowed or pool.served_name in allowed or pool.model in allowed


def may_use_alias(tenant: TenantSpec, alias: str) -> bool:
    """Whether the tenant's ``allowedModels`` admit the alias (by its name, or ``*``); its pools need no entry."""
    return "*" in tenant.allowed_models or alias in tenant.allowed_models


def _authorization(request: web.Request) -> str | None:
    """The one Authorization header; BadRequest, before any work, when it is repeated or not ASCII (a client
    cannot mean two keys, and a key is never anything but ASCII)."""
    values = request.headers.getall("Authorization", [])
    if len(values) > 1:
        raise BadRequest("more than one Authorization header", param="Authorization")
    if values and not values[0].isascii():
        raise BadRequest("malformed Authorization header: not ASCII", param="Authorization")
    return values[0] if values else None


def _no_ready_replica(pool: PoolSpec) -> NoReadyReplica:
    return NoReadyReplica(f"no ready replica for model '{pool.served_name}'", retry_after=2.0)


def _used(parsed: ParsedRequest, prompt: int | None, completion: int | None) -> int:
    return (prompt if prompt is not None else parsed.prompt_tokens) + (completion or 0)


def _client_error(exc: UpstreamError) -> GatewayError:
    """The client's error for an engine failure: what happened, never where (the log has the replica and cause)."""
    if isinstance(exc, UpstreamTimeout):
        return GatewayTimeout("the engine timed out")
    if isinstance(exc, UpstreamUnavailable | UpstreamConnectError):
        return ServiceUnavailable("no replica could take the request", retry_after=1.0)
    return UpstreamFailed("the engine failed before answering")


def new_request_id() -> str:
    return uuid.uuid4().hex
