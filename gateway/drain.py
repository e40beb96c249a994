"""Drain: a gateway told to stop loses no request, not even one written into an idle keep-alive connection.

HTTP/1.1 lets a server close an idle keep-alive connection at any moment, and a client that writes its next
request into it as it closes gets a reset it cannot tell from a crash (and must not retry: a POST is not
idempotent). So a stop that simply closes the idle connections, as aiohttp's does, fails the next request of
every client that holds one. `Drain.run` stops in the order that leaves no such moment, whatever the propagation
delay (a gateway behind a balancer and one started by hand stop the same way):

1. **readiness falls** (`/readyz` answers 503 with ``"draining": true``) so that load balancers and the Service
   stop sending new connections, and from now on **every response carries ``Connection: close``**: a client
   reads that it must not reuse the connection, and opens its next one where the balancer sends it;
2. **it keeps listening and serving** for ``propagation_s`` (``gateway.drain.propagationSeconds``: how long the
   balancers take to notice; an NLB keeps sending new connections for its deregistration delay; 0 when started by
   hand, and for ``llmfleet up``: there is no balancer to wait for);
3. **it stops listening and serves the connections it has until they are gone**, at most ``shutdown_s``: each
   kept-alive connection's next request is read and answered with ``Connection: close``, after which the
   connection closes. A connection waiting for a request is closed only once it has read nothing and answered
   nothing for `IDLE_GRACE_S` (counted from the drain's start at the earliest): a client that writes requests back
   to back never leaves its connection idle that long, so its next request is never cut, and one that pauses longer
   finds the connection closed before it writes, as after the keep-alive timeout. A response that began before the
   drain told its client to keep the connection, and the grace counts from its end, so its client's next request
   is served too;
4. **it closes what is left** (`web.AppRunner.cleanup`: requests still running once ``shutdown_s`` is spent get
   the runner's own 1 s) and exits.

A client that reconnects after ``Connection: close`` to a gateway whose listener has closed gets a refused
connection: a request the gateway never read, which the client may retry elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import math

from aiohttp import hdrs, web

from gateway.edge import EdgeRunner

__all__ = ["DRAIN", "IDLE_GRACE_S", "Drain"]

log = logging.getLogger("llmfleet.gateway.drain")
_POLL_S = 0.05
# How long a kept-alive connection must have been idle, once the drain began, before it is closed: far above the
# time a client takes to write its next request after an answer (and the loop to read it, under load), far below a
# stop that a person waits for.
IDLE_GRACE_S = 1.0


class Drain:
    """The public application's drain: install with `install`, start with `run`; `started` once it has begun."""

    def __init__(self, propagation_s: float = 0.0, shutdown_s: float = 30.0) -> None:
        if propagation_s < 0 or shutdown_s < 0:
            raise ValueError(f"drain propagation {propagation_s}s, shutdown {shutdown_s}s: give 0 or more")
        self.propagation_s = propagation_s
        self.shutdown_s = shutdown_s
        self.started = False

    @property
    def runner_timeout_s(self) -> float:
        """The shutdown timeout to build the runner with: `run` has waited ``shutdown_s`` for the requests itself,
        so the runner's cleanup only gives what is still running 1 s more."""
        return min(1.0, self.shutdown_s)

    def install(self, app: web.Application) -> None:
        """Close every connection after its response once the drain began."""
        app[DRAIN] = self
        app.on_response_prepare.append(self._close_after)

    async def _close_after(self, request: web.Request, response: web.StreamResponse) -> None:
        del request  # Unused.
        if self.started:
            # aiohttp has already chosen the Connection header when this hook runs: name it, or the client would
            # reuse a connection the server closes after this response.
            response.headers[hdrs.CONNECTION] = "close"
            response.force_close()

    async def run(self, runner: EdgeRunner) -> None:
        """Stop ``runner`` in the module's four steps; returns once its requests are finished and it is closed."""
        self.started = True
        loop = asyncio.get_running_loop()
        began = loop.time()
        log.info("draining: readiness down, Connection: close, %.1fs before the listener closes", self.propagation_s)
        if self.propagation_s > 0:
            await asyncio.sleep(self.propagation_s)  # the balancers' time to notice: a duration, not an event
        for site in list(runner.sites):
            await site.stop()
        deadline = loop.time() + self.shutdown_s
        while (now := loop.time()) < deadline:
            # idle for the grace, counted from the drain's start at the earliest: none before the grace is over
            idle_since = now - IDLE_GRACE_S if now - began >= IDLE_GRACE_S else -math.inf
            if not runner.close_idle(before=idle_since):
                break
            await asyncio.sleep(_POLL_S)
        await runner.cleanup()


DRAIN = web.AppKey("drain", Drain)
