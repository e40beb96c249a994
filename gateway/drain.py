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
3. **it stops listening and serves the connections it has until they are gone**, at most ``shutdown_s``: each
   closes after its next response (``Connection: close``), or by aiohttp's keep-alive timer when its client
   sends nothing more, as it would have without a drain. A response that began before the drain told its client
   to keep the connection, so it is not closed under that client after the response either;
4. **it closes what is left** (`web.AppRunner.cleanup`: requests still running once ``shutdown_s`` is spent get
   the runner's own short timeout) and exits.

With ``propagation_s`` 0 (``llmfleet up``, tests) steps 2 and 3 are skipped and the runner's cleanup gives
in-flight requests the shutdown timeout: a lone gateway that stops has no other to hand clients to, and a local
stop should be quick. Step 1 still applies.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import hdrs, web

__all__ = ["DRAIN", "Drain"]

log = logging.getLogger("llmfleet.gateway.drain")
_POLL_S = 0.05


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
        """The shutdown timeout to build the runner with: ``shutdown_s`` when `run` leaves the waiting to the
        runner's cleanup (no propagation), else 1 s: `run` has waited for the requests itself."""
        return self.shutdown_s if self.propagation_s == 0 else 1.0

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

    @staticmethod
    def open_connections(runner: web.AppRunner) -> int:
        server = runner.server
        return 0 if server is None else len(server.connections)

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
            deadline = loop.time() + self.shutdown_s
            while self.open_connections(runner) and loop.time() < deadline:
                await asyncio.sleep(_POLL_S)
        await runner.cleanup()


DRAIN = web.AppKey("drain", Drain)
