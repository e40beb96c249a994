"""Passthrough: a request that runs no model, sent to one chosen replica and its answer relayed.

What the gateway forwards this way takes no quota and no admission slot: a stored response's retrieve and cancel
(`gateway.held_responses`), Anthropic's token count (`gateway.token_counts`). `forward` sends the request with the
engine's headers (the request id, the engine key, the trace context) within ``timeouts.totalS`` and relays the
answer, a JSON body whole and a stream event by event, through ``rewrite`` (an id is never split between two
writes). An engine that cannot be reached is a 503, one that does not answer in time a 504. `counted` adds the
request to ``requests_total`` under its tenant and model, and writes its access-log line (its route as the
route's pattern: no response id in the log), however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.call import REQUEST_ID, upstream_headers
from gateway.endpoints import Endpoint
from gateway.errors import GatewayError, GatewayTimeout, ServiceUnavailable
from gateway.proxy import CONNECTION_BROKEN
from gateway.service import Gateway

__all__ = ["Tally", "counted", "forward"]


@dataclass
class Tally:
    """What ``requests_total`` and the access log record for one passthrough request; its handler fills it in."""

    tenant: str = "-"
    model: str = "-"
    status: int = 500
    replica: str | None = None


@contextlib.contextmanager
def counted(gateway: Gateway, request: web.Request) -> Iterator[Tally]:
    tally, wall, start = Tally(), gateway.clock.time(), gateway.clock.monotonic()
    try:
        yield tally
    except GatewayError as exc:
        tally.status = exc.status
        raise
    finally:
        gateway.metrics.child(gateway.metrics.requests, tally.tenant, tally.model, str(tally.status)).inc()
        if gateway.access_log is not None:
            gateway.access_log.write(
                {
                    "ts": round(wall, 6),
                    "request_id": request[REQUEST_ID],
                    "route": f"{request.method} {request.match_info.route.resource.canonical}"
                    if request.match_info.route.resource is not None
                    else request.path,
                    "tenant": tally.tenant,
                    "model": tally.model,
                    "replica": tally.replica,
                    "status": tally.status,
                    "done_s": round(gateway.clock.monotonic() - start, 6),
                }
            )


async def forward(
    gateway: Gateway,
    request: web.Request,
    ep: Endpoint,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    params: Mapping[str, str] | None = None,
    rewrite: Callable[[bytes], bytes] = lambda chunk: chunk,
) -> web.StreamResponse:
    timeouts = gateway.upstream.timeouts
    headers = upstream_headers(request, request[REQUEST_ID], gateway.engine_api_key)
    try:
        async with asyncio.timeout(timeouts.total_s):
            upstream = await gateway.upstream.session.request(
                method,
                ep.url + path,
                data=body,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=timeouts.connect_s),
            )
            async with upstream:
                kind = upstream.headers.get("Content-Type", "application/json")
                if upstream.status != 200 or not kind.startswith("text/event-stream"):
                    answer = rewrite(await upstream.read())
                    return web.Response(status=upstream.status, body=answer, headers={"Content-Type": kind})
                return await _relay(request, upstream, rewrite)
    except TimeoutError:
        raise GatewayTimeout("the engine timed out") from None
    except (aiohttp.ClientConnectorError, *CONNECTION_BROKEN):
        raise ServiceUnavailable("the replica cannot be reached", retry_after=1.0) from None


async def _relay(
    request: web.Request, upstream: aiohttp.ClientResponse, rewrite: Callable[[bytes], bytes]
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    buffer = b""
    async for data in upstream.content.iter_any():
        buffer += data
        cut = buffer.rfind(b"\n\n") + 2
        if cut >= 2:
            await response.write(rewrite(buffer[:cut]))
            buffer = buffer[cut:]
    if buffer:
        await response.write(rewrite(buffer))
    await response.write_eof()
    return response
