"""Held responses: ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``, answered by the replica that
holds the response.

The id is the gateway's (`gateway.response_ids`): it names the replica and the engine's own id, sealed for the
tenant that was given it. The gateway opens it with the caller's tenant and forwards the request to that replica
(`gateway.passthrough`; its query string kept: ``stream``, ``starting_after``), rewriting the engine's ids in the
answer, a streamed one event by event. An id the tenant was not given, altered, or whose replica has left the pool
or is not serving (stopped, restarting, ejected) gets 404 in OpenAI's error shape, as vLLM answers an unknown id;
never another replica's answer. What the engine answers (its own 404 for a response it did not keep, a 400 for
cancelling a response that is not running) is relayed with the ids rewritten. Neither request takes a quota or an
admission slot: neither runs the model. Each counts in ``requests_total`` under the tenant and the pool's model,
and in the access log.
"""

from __future__ import annotations

from aiohttp import web

from gateway.call import authorization
from gateway.endpoints import Endpoint
from gateway.errors import ResponseNotFound
from gateway.passthrough import counted, forward
from gateway.response_ids import Held, IdRewriter
from gateway.service import Gateway

__all__ = ["held_response"]


async def held_response(gateway: Gateway, request: web.Request, cancel: bool) -> web.StreamResponse:
    """Forward a retrieve (``cancel`` False) or a cancel to the replica holding the response the path names."""
    with counted(gateway, request) as tally:
        tenant = gateway.keys.authenticate(authorization(request))
        tally.tenant = tenant.name
        public = request.match_info["response_id"]
        held = gateway.response_ids.open(public, tenant.name)
        ep = None if held is None else _holder(gateway, held)
        if held is None or ep is None:
            raise ResponseNotFound(f"Response with id '{public}' not found.", param="response_id")
        tally.model, tally.replica = ep.model, ep.id
        rewrite = IdRewriter(gateway.response_ids, held.replica, tenant.name, {held.engine_id: public})
        path = f"/v1/responses/{held.engine_id}" + ("/cancel" if cancel else "")
        params = None if cancel else request.query
        response = await forward(
            gateway, request, ep, "POST" if cancel else "GET", path, params=params, rewrite=rewrite
        )
        tally.status = response.status
        return response


def _holder(gateway: Gateway, held: Held) -> Endpoint | None:
    """The replica holding ``held`` while it serves: a stopped engine (a restart included) has forgotten it."""
    ep = gateway.upstream.endpoints.find(held.replica)
    return ep if ep is not None and ep.ready and gateway.clock.monotonic() >= ep.ejected_until else None
