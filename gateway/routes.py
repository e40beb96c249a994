"""Routes: the gateway's public routes and their handlers, each a thin call into the `gateway.service.Gateway` the
application holds under `GATEWAY` (built by `gateway.app.create_app`).

    POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages   Gateway.complete
    GET /v1/responses/{id}, POST /v1/responses/{id}/cancel                    gateway.held_responses
    POST /v1/messages/count_tokens                                            gateway.token_counts
    GET /v1/models, GET /healthz
    every method on ENGINE_DEV_PATHS                                          404, never forwarded
"""

from __future__ import annotations

from aiohttp import web

from gateway.call import authorization
from gateway.held_responses import held_response
from gateway.service import Gateway
from gateway.token_counts import count_tokens

__all__ = ["ENGINE_DEV_PATHS", "GATEWAY", "add_public_routes", "healthz"]

# vLLM 0.33's development endpoints (VLLM_SERVER_DEV_MODE=1; docs/gateway.md): only a replica's own agent calls them.
ENGINE_DEV_PATHS = (
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/release_kv_cache_memory",
    "/pause",
    "/resume",
    "/is_paused",
    "/server_info",
)

GATEWAY = web.AppKey("gateway", Gateway)


def add_public_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_post("/v1/responses", _responses)
    app.router.add_get("/v1/responses/{response_id}", _retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", _cancel)
    app.router.add_post("/v1/messages", _messages)
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", healthz)
    for path in ENGINE_DEV_PATHS:
        app.router.add_route("*", path, _refused)
        app.router.add_route("*", path + "/{rest:.*}", _refused)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "completion")


async def _embeddings(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "embedding")


async def _responses(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "response")


async def _retrieve(request: web.Request) -> web.StreamResponse:
    return await held_response(request.app[GATEWAY], request, cancel=False)


async def _cancel(request: web.Request) -> web.StreamResponse:
    return await held_response(request.app[GATEWAY], request, cancel=True)


async def _messages(request: web.Request) -> web.StreamResponse:
    return await request.app[GATEWAY].complete(request, "message")


async def _count_tokens(request: web.Request) -> web.StreamResponse:
    return await count_tokens(request.app[GATEWAY], request)


async def _models(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    tenant = gateway.keys.authenticate(authorization(request))  # a repeated or non-ASCII header is a 400
    return web.json_response({"object": "list", "data": gateway.models.listed(tenant)})


async def healthz(request: web.Request) -> web.StreamResponse:
    del request  # Unused.
    return web.json_response({"status": "ok"})


async def _refused(request: web.Request) -> web.StreamResponse:
    """An engine development path: 404 as for any unknown path, and never forwarded."""
    del request  # Unused.
    raise web.HTTPNotFound()
