"""Token counts: Anthropic's ``POST /v1/messages/count_tokens``, which coding agents call before they send.

vLLM 0.33 answers it beside ``/v1/messages`` (``{"input_tokens", "context_management"}``): the engine tokenizes
the Messages body with its chat template and runs nothing. The gateway checks the key (``x-api-key`` or Bearer),
the body's model and messages and the tenant's right to the model, then forwards the body to the least loaded
ready replica of the model's pool (`gateway.passthrough`) and relays the answer. No quota is taken and no
admission slot held, as the count runs no model; it counts in ``requests_total``. It does not go through the pool's
router, whose affinity scorers would learn a prefix no engine computed.
"""

from __future__ import annotations

from aiohttp import web

from gateway.body import RUNNERS, parse_body
from gateway.call import REQUEST_ID, read_body
from gateway.dialects import credential
from gateway.errors import BadRequest, NoReadyReplica, UnsupportedMediaType
from gateway.passthrough import counted, forward
from gateway.routing.base import RequestInfo, endpoint_load
from gateway.service import Gateway

__all__ = ["count_tokens"]


async def count_tokens(gateway: Gateway, request: web.Request) -> web.StreamResponse:
    with counted(gateway, request) as tally:
        tenant = gateway.keys.authenticate(credential(request))
        tally.tenant = tenant.name
        if request.content_type != "application/json":
            raise UnsupportedMediaType(
                f"Content-Type must be application/json, got {request.content_type!r}", param="Content-Type"
            )
        config = gateway.config
        parsed = parse_body(await read_body(request, config.max_body_bytes, config.timeouts.body_read_s), "count")
        info = RequestInfo(
            request_id=request[REQUEST_ID],
            model=parsed.model,
            tenant=tenant.name,
            priority=tenant.priority,
            prompt=parsed.prompt,
            session_id=None,
            now=gateway.clock.monotonic(),
        )
        pool, _ = gateway.models.resolve(parsed.model, tenant, info)
        tally.model = pool.served_name
        if pool.engine.runner != RUNNERS["count"]:
            raise BadRequest(f"model {parsed.model!r} is an embedding model: it counts no Messages", param="model")
        views = [v for v in gateway.upstream.endpoints.snapshot(pool.name) if v.ready and not v.ejected]
        if not views:
            raise NoReadyReplica(f"no ready replica for model '{pool.served_name}'", retry_after=2.0)
        view = min(views, key=endpoint_load)
        ep = gateway.upstream.endpoints.get(pool.name, view.id)
        assert ep is not None  # a view of the snapshot taken with no await since
        tally.replica = ep.id
        body = parsed.upstream_body(pool.served_name)
        response = await forward(gateway, request, ep, "POST", "/v1/messages/count_tokens", body=body)
        tally.status = response.status
        return response
