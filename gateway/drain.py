"""Drain: a gateway told to stop loses no request, not even one written into an idle keep-alive connection.

HTTP/1.1 lets a server close an idle keep-alive connection at any moment, and a client that writes its next
request into it as it closes gets a reset it cannot tell from a crash (and must not retry: a POST is not
idempotent). So a stop that simply closes the idle connections, as aiohttp's does, fails the next request of
every client that holds one. `Drain.run` stops in the order that leaves no such moment:

1. **readiness falls** (`/readyz` answers 503 with ``"draining": true``) so that load balancers and the Service
   stop sending new connections, and from now on **every response carries ``Connection: close``**: a client
   reads that it must not reuse the connection, and opens its next one where the balancer sends it;
2. **it keeps listening and serving** for ``propagation_s`` (``gateway.drain.propagationSeconds``: how long the
   balancers take to notice; an NLB keeps sending new connections for its deregistration delay);
3. **it stops listening**, then waits while any connection is open with no request on it, at most the keep-alive
   timeout: such a connection was opened or last answered before the drain began, its client may still write
   into it, and aiohttp's own keep-alive timer closes it as it would have without a drain;
4. **it finishes what it accepted** (`web.AppRunner.cleanup`, up to the shutdown timeout) and exits.

With ``propagation_s`` 0 (``llmfleet up``, tests) steps 2 and 3 are skipped: a lone gateway that stops has no
other to hand clients to, and a local stop should be quick. Steps 1 and 4 still apply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

__all__ = ["DRAIN", "Drain"]

log = logging.getLogger("llmfleet.gateway.drain")
_POLL_S = 0.05

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Drain:
    """The public application's drain: install with `install`, start with `run`; `started` once it has begun."""

    def __init__(self, propagation_s: float = 0.0, keepalive_s: float = 75.0) -> None:
        if propagation_s < 0:
            raise ValueError(f"drain propagation {propagation_s}s: give 0 or more")
        self.propagation_s = propagation_s
        self.keepalive_s = keepalive_s
        self.started = False
        self._busy: dict[asyncio.BaseTransport, int] = {}  # connections with a request in progress, and how many

    def install(self, app: web.Application) -> None:
        """Count requests per connection and close every connection after its response once the drain began."""
        app[DRAIN] = self
        app.middlewares.append(self._track)
        app.on_response_prepare.append(self._close_after)

    @web.middleware
    async def _track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        if transport is None:
            return await handler(request)
        self._busy[transport] = self._busy.get(transport, 0) + 1
        try:
            return await handler(request)
        finally:
            left = self._busy.pop(transport) - 1
            if left > 0:
                self._busy[transport] = left

    async def _close_after(self, request: web.Request, response: web.StreamResponse) -> None:
        del request  # Unused.
        if self.started:
            # aiohttp has already chosen the Connection header when this hook runs: name it, or the client would
            # reuse a connection the server closes after this response. A response whose headers left before the
            # drain began keeps its connection open; step 3 waits for it.
            response.headers[hdrs.CONNECTION] = "close"
            response.force_close()

    def idle_connections(self, runner: web.AppRunner) -> int:
        """Open connections of ``runner`` with no request in progress."""
        server = runner.server
        if server is None:
            return 0
        return sum(1 for conn in server.connections if conn.transport is not None and conn.transport not in self._busy)

    async def run(self, runner: web.AppRunner) -> None:
        """Stop ``runner`` in the module's four steps; returns once its requests are finished and it is closed."""
        self.started = True
        log.info("draining: readiness down, Connection: close, %.1fs before the listener closes", self.propagation_s)
        if self.propagation_s > 0:
            await asyncio.sleep(self.propagation_s)  # the balancers' time to notice: a duration, not an event
        for site in list(runner.sites):
            await site.stop()
        if self.propagation_s > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.keepalive_s
            while self.idle_connections(runner) and loop.time() < deadline:
                await asyncio.sleep(_POLL_S)
        await runner.cleanup()


DRAIN = web.AppKey("drain", Drain)
