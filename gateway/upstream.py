"""Upstream: the engines as one request sees them: route, attempt, account, wait for a change.

`Upstream` owns what reaching an engine takes: each pool's `Router`, the `EndpointSet`, the pooled HTTP session,
the timeouts and the `RetryBudget`. The request path (`gateway.service`) and the stream relay
(`gateway.streams`) use only its verbs; neither sees the endpoint set or the session. The two wire verbs, `send`
and `open`, are the only I/O: a test replaces them (a subclass) to run the whole pipeline in-process, as httpx's
``MockTransport`` replaces a client's transport.

An `Attempt` is one request's lease on one replica, a context manager: ``with upstream.begin(view, pool, out) as
attempt:``. `Attempt.close` ends it early (a stream hands its attempt to the relay, which closes it when the
stream ends); closing twice is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Mapping
from types import TracebackType

import aiohttp

from fleet.protocol.clock import Clock
from fleet.spec.stack import PoolSpec
from gateway.endpoints import Endpoint, EndpointSet
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from gateway.metrics import GatewayMetrics
from gateway.outcome import Outcome
from gateway.proxy import DONE_MARKERS, JsonAnswer, SseRelay, Timeouts, open_stream, send_json
from gateway.retries import RetryBudget
from gateway.routing.base import Decision, EndpointView, RequestInfo, Router, expected_prefill

__all__ = ["Attempt", "Upstream"]


class Attempt:
    """One attempt on one replica: its lease (the replica's in-flight counts) from `Upstream.begin` until `close`
    or the end of the ``with`` block, whichever comes first. Writes the attempt's part of ``out``: ``attempts``,
    ``replica`` and ``upstream_s`` (the time the lease was held).

    It also counts the request's prompt on the replica for the ``least-work`` picker: ``prompt_tokens`` less the
    share its router expected the cache to hold (``spared``) in `Endpoint.prefill_tokens` until `answered` (the
    first event of a stream; a whole answer stays there to its end), then all of them in ``context_tokens``."""

    def __init__(
        self,
        lease: contextlib.AbstractContextManager[Endpoint],
        metrics: GatewayMetrics,
        clock: Clock,
        pool: PoolSpec,
        out: Outcome,
        prompt_tokens: int = 0,
        spared: float = 0.0,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self.ep = self._stack.enter_context(lease)
        self._uncached, self._tokens, self._answered = expected_prefill(prompt_tokens, spared), prompt_tokens, False
        self.ep.prefill_tokens += self._uncached
        self._stack.callback(self._release)
        self._clock, self._out = clock, out
        gauge = metrics.child(metrics.in_flight, pool.name, self.ep.id)
        gauge.inc()
        self._stack.callback(gauge.dec)
        self._started: float | None = clock.monotonic()
        out.attempts += 1
        out.replica = self.ep.id
        metrics.child(metrics.routed, pool.served_name, self.ep.id).inc()

    @property
    def uncached(self) -> int:
        """The prompt tokens the replica is expected to prefill: those its router did not expect it to hold."""
        return self._uncached

    def answered(self) -> None:
        """The replica has answered (a stream's first event): the prompt is prefilled and its context decodes."""
        if not self._answered and self._started is not None:
            self._answered = True
            self.ep.prefill_tokens -= self._uncached
            self.ep.context_tokens += self._tokens

    def _release(self) -> None:
        if self._answered:
            self.ep.context_tokens -= self._tokens
        else:
            self.ep.prefill_tokens -= self._uncached

    def close(self) -> None:
        if self._started is not None:
            self._out.upstream_s += self._clock.monotonic() - self._started
            self._started = None
            self._stack.close()

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Upstream:
    """Each pool's replicas, their routers, the wire to them and the retry budget.

    ``changed(pool)`` is to be called whenever a pool's replicas may have changed (membership, readiness,
    ejection, a refresh round); it wakes every `wait_for_change` on that pool.
    """

    def __init__(
        self,
        endpoints: EndpointSet,
        routers: Mapping[str, Router],
        session: aiohttp.ClientSession,
        timeouts: Timeouts,
        budget: RetryBudget,
        max_attempts: int,
        metrics: GatewayMetrics,
        clock: Clock,
    ) -> None:
        self.endpoints = endpoints
        self.routers = routers
        self.session = session
        self.timeouts = timeouts
        self.budget = budget
        self.max_attempts = max_attempts  # all attempts of one request together, resumes included
        self.metrics = metrics
        self.clock = clock
        self._changes: dict[str, asyncio.Event] = {}  # set, then replaced, when a pool's replicas change

    # -- routing -------------------------------------------------------------------------------------------
    def routable(self, pool: str) -> int:
        """The pool's replicas that are ready and not ejected."""
        return self.endpoints.routable(pool)

    def picker(self, pool: str) -> str:
        return self.routers[pool].picker.name

    def route(
        self,
        pool: str,
        info: RequestInfo,
        exclude: Collection[str] = (),
        *,
        ready_only: bool = False,
        only: str | None = None,
    ) -> Decision | None:
        """The pool router's pick among its replicas but ``exclude`` (ids), only ready ones with ``ready_only``,
        and only replica ``only`` when set (a follow-up to the response it holds; its filters still apply)."""
        views = [
            v
            for v in self.endpoints.snapshot(pool)
            if v.id not in exclude and (v.ready or not ready_only) and (only is None or v.id == only)
        ]
        return self.routers[pool].route(views, info)

    def begin(
        self, view: EndpointView, pool: PoolSpec, out: Outcome, prompt_tokens: int = 0, spared: float = 0.0
    ) -> Attempt:
        """Lease the replica behind ``view`` (a `route` pick with no await since) for one attempt of a request of
        ``prompt_tokens`` (0: not known), ``spared`` of which its router expected the replica's cache to hold."""
        return Attempt(self.endpoints.lease(view), self.metrics, self.clock, pool, out, prompt_tokens, spared)

    # -- the wire ------------------------------------------------------------------------------------------
    async def send(self, ep: Endpoint, path: str, body: bytes, headers: dict[str, str]) -> JsonAnswer:
        """One whole (not streamed) answer from ``ep`` (`gateway.proxy.send_json`)."""
        return await send_json(self.session, ep.url + path, body, headers, self.timeouts)

    async def open(
        self,
        ep: Endpoint,
        path: str,
        body: bytes,
        headers: dict[str, str],
        hide_usage: bool,
        ends: tuple[bytes, ...] = DONE_MARKERS,
    ) -> tuple[SseRelay, bytes]:
        """A stream from ``ep`` up to its first event (`gateway.proxy.open_stream`), ended by ``ends``."""
        return await open_stream(self.session, ep.url + path, body, headers, self.timeouts, hide_usage, ends)

    # -- health and budget ---------------------------------------------------------------------------------
    def succeeded(self, ep: Endpoint) -> None:
        self.endpoints.succeeded(ep)

    def account(self, ep: Endpoint, exc: UpstreamError) -> None:
        """Health bookkeeping for a failed attempt: readiness for refusals, outlier ejection for replica faults."""
        if isinstance(exc, UpstreamUnavailable | UpstreamConnectError):
            self.take_out(ep)
        if exc.replica_fault:
            self.endpoints.failed(ep, eject_now=isinstance(exc, UpstreamTimeout))

    def take_out(self, ep: Endpoint) -> None:
        """Out of rotation until its next good probe."""
        self.endpoints.set_ready(ep, False)

    def on_request(self) -> None:
        """A new request: it earns the retry budget its fraction."""
        self.budget.on_request()

    def may_retry(self, out: Outcome) -> bool:
        """Whether a request that failed before its first byte may try another replica (spends the budget)."""
        return out.attempts < self.max_attempts and self.budget.try_spend()

    def may_resume(self, out: Outcome) -> bool:
        """Whether a broken stream may try to continue on another replica (`RetryBudget.try_resume`)."""
        return out.attempts < self.max_attempts and self.budget.try_resume(out.resumes)

    # -- waiting for replicas ------------------------------------------------------------------------------
    def changed(self, pool: str) -> None:
        changed = self._changes.pop(pool, None)
        if changed is not None:
            changed.set()

    async def wait_for_change(self, pool: str, timeout_s: float) -> None:
        """Return when ``pool``'s replicas may have changed, or after ``timeout_s``."""
        changed = self._changes.setdefault(pool, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed.wait()
