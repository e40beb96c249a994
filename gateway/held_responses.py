"""Held responses: ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``, answered by the replica that
holds the response.

The id is the gateway's (`gateway.response_ids`): it names the replica and the engine's own id, sealed for the
tenant that was given it. The gateway opens it with the caller's tenant and forwards the request to that replica
(its query string kept: ``stream``, ``starting_after``), rewriting the engine's ids in the answer, a streamed one
event by event. An id the tenant was not given, altered, or whose replica has left the pool or is not serving
(stopped, restarting, ejected) gets 404 in OpenAI's error shape, as vLLM answers an unknown id; never another
replica's answer. What the engine answers (its own 404
for a response it did not keep, a 400 for cancelling a response that is not running) is relayed with the ids
rewritten. Neither request takes a quota or an admission slot: neither runs the model. Each counts in
``requests_total`` under the tenant and the pool's model.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.call import REQUEST_ID, authorization, upstream_headers
from gateway.endpoints import Endpoint
from gateway.errors import GatewayError, GatewayTimeout, ResponseNotFound, ServiceUnavailable
from gateway.proxy import CONNECTION_BROKEN
from gateway.response_ids import Held, IdRewriter
from gateway.service import Gateway

__all__ = ["held_response"]


async def held_response(gateway: Gateway, request: web.Request, cancel: bool) -> web.StreamResponse:
    """Forward a retrieve (``cancel`` False) or a cancel to the replica holding the response the path names."""
    tenant_name, model, status = "-", "-", 500
    try:
        tenant = gateway.keys.authenticate(authorization(request))
        tenant_name = tenant.name
        public = request.match_info["response_id"]
        held = gateway.response_ids.open(public, tenant.name)
        ep = None if held is None else _holder(gateway, held)
        if held is None or ep is None:
            raise ResponseNotFound(f"Response with id '{public}' not found.", param="response_id")
        model = ep.model
        rewrite = IdRewriter(gateway.response_ids, held.replica, tenant.name, {held.engine_id: public})
        response = await _forward(gateway, request, ep, held, cancel, rewrite)
        status = response.status
        return response
    except GatewayError as exc:
        status = exc.status
        raise
    finally:
        gateway.metrics.child(gateway.metrics.requests, tenant_name, model, str(status)).inc()


def _holder(gateway: Gateway, held: Held) -> Endpoint | None:
    """The replica holding ``held`` while it serves: a stopped engine (a restart included) has forgotten it."""
    endpoints, now = gateway.upstream.endpoints, gateway.clock.monotonic()
    for pool in endpoints.pools:
        ep = endpoints.get(pool, held.replica)
        if ep is not None:
            return ep if ep.ready and now >= ep.ejected_until else None
    return None


async def _forward(
    gateway: Gateway, request: web.Request, ep: Endpoint, held: Held, cancel: bool, rewrite: IdRewriter
) -> web.StreamResponse:
    timeouts = gateway.upstream.timeouts
    url = f"{ep.url}/v1/responses/{held.engine_id}" + ("/cancel" if cancel else "")
    headers = upstream_headers(request, request[REQUEST_ID], gateway.engine_api_key)
    try:
        async with asyncio.timeout(timeouts.total_s):
            upstream = await gateway.upstream.session.request(
                "POST" if cancel else "GET",
                url,
                params=None if cancel else request.query,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=timeouts.connect_s),
            )
            async with upstream:
                kind = upstream.headers.get("Content-Type", "application/json")
                if upstream.status != 200 or not kind.startswith("text/event-stream"):
                    body = rewrite(await upstream.read())
                    return web.Response(status=upstream.status, body=body, headers={"Content-Type": kind})
                return await _relay(request, upstream, rewrite)
    except TimeoutError:
        raise GatewayTimeout("the engine timed out") from None
    except (aiohttp.ClientConnectorError, *CONNECTION_BROKEN):
        raise ServiceUnavailable("the replica holding the response cannot be reached", retry_after=1.0) from None


async def _relay(request: web.Request, upstream: aiohttp.ClientResponse, rewrite: IdRewriter) -> web.StreamResponse:
    """A replayed stream, passed on event by event (an id is never split between two writes)."""
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
