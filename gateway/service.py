"""Service: one request's life in the gateway: auth -> body -> model -> quota -> admission -> attempts.

Retries happen only before the first byte reached the client, only for retryable failures (`UpstreamError`
``retryable``), always on a replica not tried yet, at most ``retries.maxAttempts`` attempts and only while the
`RetryBudget` allows (`Upstream.may_retry`). After the first byte a stream belongs to
`gateway.streams.StreamSession`: a failure ends it with an SSE error event and ``[DONE]``, or, in a pool that
resumes streams, continues it on another replica. The quota reservation is settled in every path: the engine's
usage when known, the relayed events otherwise, nothing when no engine ran the request.

Each phase writes its own part of the request's `Outcome`: `Gateway.complete` the status and error, `_intake`
who asked for what (tenant, stream, model, pool, adapter, alias), `_admitted` the queue wait, each `Attempt` the
attempts, replica and upstream time, `_attempts` the routing time, and the answer (`_answer`, or the
`StreamSession` of a stream) the tokens and the first token's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from fleet.protocol.clock import Clock
from fleet.spec.stack import GatewaySpec, PoolSpec, TenantSpec
from gateway.admission import Admission
from gateway.auth import KeyRing
from gateway.body import RUNNERS, Kind, ParsedRequest, parse_body
from gateway.cache_salt import CacheSalts
from gateway.call import REQUEST_ID, Call, new_request_id, read_body
from gateway.dialects import credential, stream_ends
from gateway.endpoints import Endpoint, EndpointSet, Refresher
from gateway.errors import (
    BadRequest,
    GatewayError,
    GatewayTimeout,
    NoReadyReplica,
    ResponseNotFound,
    ServiceUnavailable,
    UnsupportedMediaType,
    UpstreamConnectError,
    UpstreamError,
    UpstreamFailed,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.kv_events import KvEventFeed
from gateway.metrics import AccessLog, GatewayMetrics
from gateway.models import Models
from gateway.outcome import Outcome, record
from gateway.prompt_tokens import PromptTokens
from gateway.proxy import SseRelay
from gateway.quota.base import QuotaBackend, QuotaLimits, check_fits
from gateway.reporting import PoolTraffic
from gateway.response_ids import Held, IdRewriter, ResponseIds
from gateway.routing.aliases import AliasTable
from gateway.routing.base import RequestInfo
from gateway.shares import CapacityShares
from gateway.streams import Segment, StreamSession
from gateway.tracing import RequestSpans, Tracing
from gateway.two_legs import PrefillLeg, decode_opened, with_kv_transfer
from gateway.upstream import Attempt, Upstream

__all__ = ["Gateway"]

log = logging.getLogger("llmfleet.gateway")


@dataclasses.dataclass(frozen=True, eq=False)
class Gateway:
    """The request path over its parts, every one built by `gateway.app.build_gateway`; `complete` answers one
    completion request."""

    config: GatewaySpec
    keys: KeyRing
    models: Models
    quota: QuotaBackend
    admission: Mapping[str, Admission]  # per pool
    traffic: Mapping[str, PoolTraffic]  # per pool, reported to the control plane
    upstream: Upstream
    metrics: GatewayMetrics
    tracing: Tracing
    access_log: AccessLog | None
    clock: Clock
    engine_api_key: str | None = dataclasses.field(repr=False)  # what the engines require of their callers
    dynamic: bool  # replicas come from a control plane: a pool with none may get some while a request waits
    # Not read by the request path: held for the app's background loops and its admin routes.
    refresher: Refresher
    shares: CapacityShares
    cold: asyncio.Event  # set when a request waits for a pool with no capacity: report at once
    prompt_tokens: PromptTokens  # the prompt as the engine tokenizes it, for pools routed by kv-cache
    kv_feed: KvEventFeed  # the engines' KV events into the kv-cache scorers' indexes
    response_ids: ResponseIds  # the ids clients get for responses: the replica holding each, sealed per tenant

    @functools.cached_property
    def cache_salts(self) -> CacheSalts:
        """The engines' ``cache_salt`` per tenant (`gateway.cache_salt`), keyed from the engines' key."""
        return CacheSalts.from_engine_key(self.engine_api_key)

    @functools.cached_property
    def two_legs(self) -> PrefillLeg:
        """The prefill leg of requests to disaggregated pools (`gateway.two_legs`)."""
        return PrefillLeg(self.upstream)

    @property
    def endpoints(self) -> EndpointSet:
        """The upstream's replicas, as the readiness route reads them."""
        return self.upstream.endpoints

    def set_aliases(self, table: AliasTable) -> None:
        """`Models.set_aliases`: what a control plane's alias weights arrive through."""
        self.models.set_aliases(table)

    async def complete(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        """Answer one completion request (``kind``), recording its Outcome however it ends."""
        out = Outcome(request_id=request[REQUEST_ID], received=self.clock.monotonic())
        wall = self.clock.time()
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
            if request.transport is None or request.transport.is_closing():  # not a stop cancelling it
                self.metrics.client_error("disconnect", f"gone during {request.method} {request.path}", request.remote)
            raise
        finally:
            out.done_s = self.clock.monotonic() - out.received
            record(out, wall, self.metrics, self.traffic.get(out.pool or ""), self.access_log)
            spans.finish(out)

    async def _complete(
        self, request: web.Request, kind: Kind, out: Outcome, spans: RequestSpans
    ) -> web.StreamResponse:
        tenant, parsed, pool, info = await self._intake(request, kind, out, spans)
        held, pool = self._previous(parsed, pool, out)
        if out.alias is not None:  # the pool the request goes to: a follow-up's is its conversation's
            self.metrics.child(self.metrics.alias_routed, out.alias, pool.name).inc()
        with spans.phase("quota", {"llmfleet.tenant": tenant.name}):
            limits = QuotaLimits.of(tenant)
            check_fits(limits, parsed.reserve_tokens)
            # The concurrency slot is keyed by an id the gateway makes: the client's x-request-id is only echoed
            # and logged, so requests sharing one cannot share a slot.
            reservation = await self.quota.acquire(tenant.name, limits, new_request_id(), parsed.reserve_tokens)
        try:
            if not self.dynamic and self.upstream.routable(pool.name) == 0:
                raise _no_ready_replica(pool)
            async with self._admitted(tenant, pool, out, spans):
                # Routed as the pool's served name, at the time it leaves the queue.
                info = dataclasses.replace(
                    info,
                    model=pool.served_name,
                    adapter=out.adapter,
                    now=self.clock.monotonic(),
                    token_ids=self.prompt_tokens.ids(pool.name, parsed),
                    cache_salt=self._salt(tenant, parsed),
                )
                return await self._attempts(
                    Call.of(request, tenant, parsed, pool, info, self.engine_api_key, out, spans, held)
                )
        finally:
            await self.quota.release(reservation, out.used_tokens)

    async def _intake(
        self, request: web.Request, kind: Kind, out: Outcome, spans: RequestSpans
    ) -> tuple[TenantSpec, ParsedRequest, PoolSpec, RequestInfo]:
        """Who asks (the key), for what (the body) and which pool serves it; the request as the model lookup saw
        it (its model the client's name)."""
        with spans.phase("auth") as span:
            tenant = self.keys.authenticate(credential(request))
            span.set_attribute("llmfleet.tenant", tenant.name)
        out.tenant = tenant.name
        if request.content_type != "application/json":
            raise UnsupportedMediaType(
                f"Content-Type must be application/json, got {request.content_type!r}", param="Content-Type"
            )
        timeouts = self.config.timeouts
        parsed = parse_body(await read_body(request, self.config.max_body_bytes, timeouts.body_read_s), kind)
        out.stream = parsed.stream
        info = RequestInfo(
            request_id=out.request_id,
            model=parsed.model,
            tenant=tenant.name,
            priority=tenant.priority,
            prompt=parsed.prompt,
            session_id=request.headers.get(self.config.session_header),
            now=self.clock.monotonic(),
            estimated_tokens=parsed.prompt_tokens,
        )
        pool, alias = self.models.resolve(parsed.model, tenant, info)
        out.model = pool.served_name  # never the client's string: metric labels stay bounded
        out.pool = pool.name
        if pool.engine.runner != RUNNERS[kind]:  # vLLM serves embeddings or generation, never both
            raise BadRequest(_wrong_runner(parsed.model, pool), param="model")
        if self.models.is_adapter(parsed.model):
            out.adapter = parsed.model
        if alias is not None:
            out.alias = alias.name
        spans.annotate({"llmfleet.pool": pool.name, "llmfleet.priority": tenant.priority})
        return tenant, parsed, pool, info

    def _salt(self, tenant: TenantSpec, parsed: ParsedRequest) -> str:
        """The ``cache_salt`` the engine gets: the tenant's (its group's), with the client's own folded in."""
        salts = self.cache_salts
        return salts.combined(salts.for_tenant(tenant.name, tenant.cache_group), parsed.client_salt)

    def _previous(self, parsed: ParsedRequest, pool: PoolSpec, out: Outcome) -> tuple[Held | None, PoolSpec]:
        """Where a follow-up's previous response lives, and the pool to send it to: that replica's pool, when it is
        ``pool`` or another pool of the alias the request names (a canary's twin: the conversation stays where it
        is, whatever the alias's weights); a 404 when the replica has left, or belongs to another model."""
        public = parsed.previous_response_id
        if public is None:
            return None, pool
        held = self.response_ids.open(public, out.tenant)
        member = None if held is None else self.upstream.endpoints.find(held.replica)
        holder = None if member is None else member.pool
        alias = self.models.aliases.get(parsed.model)
        if holder is not None and holder != pool.name and (alias is None or holder not in alias.pools):
            holder = None
        if held is None or holder is None:
            raise ResponseNotFound(f"Response with id '{public}' not found.", param="previous_response_id")
        if holder != pool.name:
            pool = self.models.pool(holder)
            out.model, out.pool = pool.served_name, pool.name
        return held, pool

    @contextlib.asynccontextmanager
    async def _admitted(
        self, tenant: TenantSpec, pool: PoolSpec, out: Outcome, spans: RequestSpans
    ) -> AsyncIterator[None]:
        """Hold one of the pool's admission slots (queued behind others by priority) for the block."""
        admission, traffic = self.admission[pool.name], self.traffic[pool.name]
        depth = self.metrics.child(self.metrics.queue_depth, pool.served_name)
        depth.set(admission.waiting + 1)
        traffic.arrived += 1
        try:
            with spans.phase("queued", {"llmfleet.priority": tenant.priority}):
                slot = await admission.acquire(tenant.name, tenant.priority)
        finally:
            depth.set(admission.waiting)
        traffic.admitted += 1
        out.queued_s = slot.waited_s
        self.metrics.child(self.metrics.queue_wait, pool.served_name, str(tenant.priority)).observe(slot.waited_s)
        try:
            yield
        finally:
            slot.release()

    async def _attempts(self, call: Call) -> web.StreamResponse:
        """Route and try until an answer, a failure not to retry, or the attempts or retry budget run out."""
        up, out, pool = self.upstream, call.out, call.pool
        tried: set[str] = set()
        retry_reason: str | None = None  # the failure that sent the request to its next replica
        up.on_request()
        pinned = call.held.replica if call.held else None
        while True:
            with call.spans.phase("route", {"llmfleet.routing.picker": up.picker(pool.name)}) as span:
                decision = up.route(pool.name, call.info, exclude=tried, only=pinned)
                if decision is None and pinned is not None and not tried:  # it holds the response, and cannot serve
                    raise ResponseNotFound(
                        f"Response with id '{call.parsed.previous_response_id}' not found: the replica holding it is "
                        "not serving",
                        param="previous_response_id",
                    )
                if decision is None:
                    raise _no_ready_replica(pool)
                span.set_attributes(
                    {"llmfleet.replica": decision.endpoint.id, "llmfleet.routing.candidates": decision.candidates}
                )
            if retry_reason is not None:  # counted once another replica takes it, not when none is left
                self.metrics.child(self.metrics.retries, pool.served_name, retry_reason).inc()
            tried.add(decision.endpoint.id)
            with up.begin(decision.endpoint, pool, out, call.info.prompt_tokens, decision.spared) as attempt:
                out.routed_s = self.clock.monotonic() - out.received
                try:
                    return await self._answer(call, attempt, retry_reason)
                except UpstreamStatus as exc:
                    up.account(attempt.ep, exc)
                    rewrite = self._rewriter(call, attempt.ep.id)  # the engine's 404 names the previous response
                    body = exc.body if rewrite is None else rewrite(exc.body)
                    return web.Response(status=exc.status, body=body, headers={"Content-Type": exc.content_type})
                except UpstreamError as exc:
                    up.account(attempt.ep, exc)
                    if exc.retryable and up.may_retry(out):
                        retry_reason = type(exc).__name__
                        log.info("retrying %s on another replica after %s from %s", out.request_id, exc, attempt.ep.id)
                        continue
                    log.warning("%s failed on %s: %s", out.request_id, attempt.ep.id, exc)
                    raise _client_error(exc) from exc

    async def _answer(self, call: Call, attempt: Attempt, retry_reason: str | None) -> web.StreamResponse:
        """One attempt's answer: a whole one, or a stream handed to a `StreamSession` once its first event came.

        In a disaggregated pool the prefill leg runs first when the decision says so (`gateway.two_legs`); a decode
        leg that fails before anything reached the client is done again on the same replica, aggregated."""
        up, out, ep, spans = self.upstream, call.out, attempt.ep, call.spans
        kv = await self.two_legs.run(call, attempt.uncached) if self.two_legs.applies(call) else None
        if call.parsed.stream:
            deadline = asyncio.get_running_loop().time() + up.timeouts.total_s
            session = StreamSession(call, up, self._rewriter(call, ep.id))
            with spans.upstream(ep.id, call.pool.name, ep.url, out.attempts, retry_reason) as span:
                headers = spans.headers_for(span, call.headers)
                hide, ends = not call.parsed.client_wants_usage, stream_ends(call.parsed.kind)
                if kv is None:
                    relay, first = await up.open(ep, call.path, session.body, headers, hide, ends)
                else:
                    relay, first = await self._decode_leg(call, ep, session.body, headers, hide, ends, kv)
            attempt.answered()
            # From here on bytes reach the client: the session owns the attempt, no retry.
            return await session.run(Segment(attempt, relay, first), deadline)
        with spans.upstream(ep.id, call.pool.name, ep.url, out.attempts, retry_reason) as span:
            headers = spans.headers_for(span, call.headers)
            try:
                answer = await up.send(ep, call.path, with_kv_transfer(call.body, kv), headers)
            except UpstreamError as exc:
                if kv is None or (isinstance(exc, UpstreamStatus) and exc.status < 500):
                    raise
                self.two_legs.counted(call, "decode_failed")  # as for a stream: aggregated on the same replica
                answer = await up.send(ep, call.path, call.body, headers)
        up.succeeded(ep)
        out.prompt_tokens = answer.usage.prompt_tokens
        out.completion_tokens = answer.usage.completion_tokens
        out.used_tokens = call.used_tokens()
        out.first_token_s = self.clock.monotonic() - out.received
        rewrite = self._rewriter(call, ep.id)
        body = answer.body if rewrite is None else rewrite(answer.body)
        return web.Response(
            status=200, body=body, headers={"Content-Type": answer.content_type, "x-llmfleet-replica": ep.id}
        )

    async def _decode_leg(
        self,
        call: Call,
        ep: Endpoint,
        body: bytes,
        headers: dict[str, str],
        hide: bool,
        ends: tuple[bytes, ...],
        kv: dict[str, Any],
    ) -> tuple[SseRelay, bytes]:
        """A streamed decode leg up to its first token; when the decode engine could not load the KV cache (its
        first token is an error, never came within ``timeouts.firstTokenS``, or the leg broke before it) nothing
        has reached the client, so the same replica prefills the request itself (``body``, aggregated)."""
        up = self.upstream
        try:
            relay, first = await up.open(ep, call.path, with_kv_transfer(body, kv), headers, hide, ends)
        except UpstreamError as exc:
            log.info("decode leg of %s failed on %s: %s; answering it aggregated", call.out.request_id, ep.id, exc)
        else:
            opened = await decode_opened(relay, first, call.parsed.kind, up.timeouts.first_token_s)
            if opened is not None:
                return relay, opened
            relay.resp.close()
        self.two_legs.counted(call, "decode_failed")
        return await up.open(ep, call.path, body, headers, hide, ends)

    def _rewriter(self, call: Call, replica: str) -> IdRewriter | None:
        """For a Responses answer from ``replica``: its ids as the client gets them (`gateway.response_ids`)."""
        if call.parsed.kind != "response":
            return None
        known = {call.held.engine_id: call.parsed.previous_response_id or ""} if call.held else None
        return IdRewriter(self.response_ids, replica, call.tenant.name, known)


def _no_ready_replica(pool: PoolSpec) -> NoReadyReplica:
    return NoReadyReplica(f"no ready replica for model '{pool.served_name}'", retry_after=2.0)


def _client_error(exc: UpstreamError) -> GatewayError:
    """The client's error for an engine failure: what happened, never where (the log has the replica and cause)."""
    if isinstance(exc, UpstreamTimeout):
        return GatewayTimeout("the engine timed out")
    if isinstance(exc, UpstreamUnavailable | UpstreamConnectError):
        return ServiceUnavailable("no replica could take the request", retry_after=1.0)
    return UpstreamFailed("the engine failed before answering")


def _wrong_runner(model: str, pool: PoolSpec) -> str:
    """Why ``model`` cannot answer this kind of request: its pool's engine runs the other of vLLM's runners."""
    if pool.engine.runner == "pooling":
        return (
            f"model {model!r} is an embedding model (pool {pool.name} runs engine.runner pooling): use /v1/embeddings"
        )
    return f"model {model!r} generates text (pool {pool.name}) and has no embeddings: use an embedding model's pool"
