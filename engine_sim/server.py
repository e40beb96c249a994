"""Server: vLLM's OpenAI-compatible HTTP surface over one simulated `Engine`, on aiohttp.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (JSON or SSE), the Responses routes
(`engine_sim.responses`), Anthropic's ``POST /v1/messages`` (`engine_sim.messages`), ``GET /v1/models``,
``GET /health`` (200 empty body; 503 when the engine is dead), ``GET|POST /ping``, ``GET /version``,
``GET /load``, ``GET /metrics``; with sleep mode (``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``) also
``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping`` and ``POST /collective_rpc`` (`engine_sim.sleep`); with
``VLLM_SERVER_DEV_MODE=1`` ``POST /reset_prefix_cache`` -> ``{"success": bool}`` (false while a request holds blocks).
Errors use vLLM's ``{"error": {message, type, param, code}}`` shape
(`fleet.protocol.openai_error`, through `RequestError`) with vLLM's statuses; validation errors on a streaming request
are plain JSON with a 4xx, errors after the first chunk arrive in-band followed by ``data: [DONE]``. A client
that disconnects aborts its request (handler cancellation), which frees its KV blocks at once. With a NixlConnector
(``--kv-transfer-config``) chat and completion requests play vLLM's P/D legs (`engine_sim.pd_legs`).

aiohttp rather than FastAPI/uvicorn: one event loop writes several thousand SSE chunks a second with
templated bytes and no per-chunk pydantic work.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from engine_sim import VLLM_VERSION
from engine_sim.config import EngineConfig
from engine_sim.embeddings import embedding_body, parse_embedding_request
from engine_sim.engine import ENGINE_DEAD_MESSAGE, Engine, EngineState, TokenStream, collect
from engine_sim.errors import RequestError
from engine_sim.faults import FaultPolicy, FaultSpec
from engine_sim.messages import MessagesApi
from engine_sim.nixl import NixlConnector
from engine_sim.pd_legs import PLAIN, Leg, base_id_of, failed_leg_response, prepare_leg
from engine_sim.protocol import GenerationRequest, ResponseFramer, cache_salt_of, dumps, parse_generation_request
from engine_sim.request import SimRequest
from engine_sim.responses import ResponsesApi
from engine_sim.sleep import SleepController, add_sleep_routes
from engine_sim.tokenize_api import add_tokenize_routes
from engine_sim.tokenizer import APPROX, SimTokenizer
from engine_sim.validation import json_body

__all__ = ["ServerSettings", "create_app"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServerSettings:
    model: str
    served_model_names: tuple[str, ...]
    max_model_len: int
    api_key: str | None = None
    enable_prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False
    enable_request_id_headers: bool = False
    tokenizer: SimTokenizer = APPROX  # --tokenizer: prompt ids and the filler words generated
    responses_store: bool = False  # $VLLM_ENABLE_RESPONSES_API_STORE: keep responses for GET and follow-ups
    version: str = VLLM_VERSION  # what GET /version says: the release the simulated build mimics (engine_sim.platform)


def system_fingerprint(version: str, config: EngineConfig) -> str:
    """vLLM's default (``full``) fingerprint: ``vllm-<version>[-tp<N>]-<8 hex of the config's hash>``. The hash is
    the simulator's own over what it serves (vLLM hashes its whole config), so only the shape matches."""
    tp = f"-tp{config.tensor_parallel_size}" if config.tensor_parallel_size > 1 else ""
    digest = hashlib.sha256(repr((config.model, config.served_model_name, config.max_model_len)).encode())
    return f"vllm-{version}{tp}-{digest.hexdigest()[:8]}"


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def error_response(error: RequestError) -> web.Response:
    return _json(error.to_json(), status=error.status)


def _engine_failed(message: str) -> RequestError:
    """The engine failed the request after accepting it (vLLM answers 500)."""
    return RequestError(500, message, "InternalServerError")


class _Routes:
    def __init__(
        self,
        engine: Engine,
        settings: ServerSettings,
        faults: FaultPolicy,
        on_crash: Callable[[], None],
        on_die: Callable[[], None],
        sleep: SleepController | None,
        nixl: NixlConnector | None = None,
    ) -> None:
        self.engine = engine
        self.nixl = nixl
        self.sleep = sleep
        self.settings = settings
        self.faults = faults
        self.on_crash = on_crash
        self.created = int(time.time())
        self.fingerprint = system_fingerprint(settings.version, engine.config)
        lora = engine.config.lora
        self.model_names = settings.served_model_names + (lora.names if lora is not None else ())
        if faults.spec.die_mid_stream_after_tokens is not None:

            def hook(stream: TokenStream) -> None:
                if faults.should_die(stream.request.num_output_tokens):
                    on_die()

            engine.on_token = hook

    # -- simple endpoints ----------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        del request  # Unused.
        return web.Response(status=503 if self.engine.state is EngineState.DEAD else 200)

    async def version(self, request: web.Request) -> web.Response:
        del request  # Unused.
        return _json({"version": self.settings.version})

    async def load(self, request: web.Request) -> web.Response:
        del request  # Unused.
        return _json({"server_load": 0})

    async def metrics(self, request: web.Request) -> web.Response:
        del request  # Unused.
        body = self.engine.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        del request  # Unused.
        s = self.settings
        cards = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": s.model,
                "parent": None,
                "max_model_len": s.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{name}",
                        "object": "model_permission",
                        "created": self.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in s.served_model_names
        ]
        lora = self.engine.config.lora
        if lora is not None:  # vLLM lists each adapter with its path as root and the base model as parent
            for name, path, _ in lora.modules:
                cards.append({**cards[0], "id": name, "root": path, "parent": s.served_model_names[0]})
        return _json({"object": "list", "data": cards})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        del request  # Unused: vLLM's reset_running_requests and reset_external have nothing to act on here.
        return _json({"success": self.engine.try_reset_prefix_cache()})

    # -- generation ----------------------------------------------------------------------------------------
    async def embeddings(self, request: web.Request) -> web.Response:
        """A pooling server's ``/v1/embeddings`` (`engine_sim.embeddings`): each input a one-step request."""
        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError) as exc:
            return error_response(RequestError(400, f"Invalid JSON body: {type(exc).__name__}"))
        s, dims = self.settings, self.engine.config.facts.hidden_size
        try:
            embed = parse_embedding_request(body, s.served_model_names, s.max_model_len, s.tokenizer, dims)
            salt = cache_salt_of(body)
        except RequestError as exc:
            return error_response(exc)
        action = self.faults.on_request()
        if action.crash:
            self.crash()
        elif action.error is not None:
            return error_response(action.error)
        streams: list[TokenStream] = []
        try:
            for i, ids in enumerate(embed.inputs):
                request_id = f"embd-{uuid.uuid4().hex}-{i}"
                streams.append(self.engine.submit(SimRequest(request_id, ids, 1, cache_salt=salt)))
            for stream in streams:
                while (await stream.next_batch())[1] is None:
                    pass
                if stream.error is not None:
                    return error_response(_engine_failed(stream.error))
        except RequestError as exc:
            return error_response(exc)
        finally:
            for stream in streams:
                if stream.finished is None:
                    self.engine.abort(stream.request.request_id)
        return _json(embedding_body(embed, dims))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            # The bytes, as vLLM's server parses them: a charset the client declares is not used (nor looked up).
            body = json_body(await request.read())
        except RequestError as exc:
            return error_response(exc)
        except ValueError as exc:
            return error_response(RequestError(400, f"Invalid JSON body: {exc}"))
        except RecursionError:  # nested past the parser's limit: still the client's error, not the engine's
            return error_response(RequestError(400, "Invalid JSON body: nested too deeply"))
        s = self.settings
        try:
            gen = parse_generation_request(body, kind, self.model_names, s.max_model_len, s.tokenizer)
        except RequestError as exc:
            return error_response(exc)
        if s.enable_force_include_usage and gen.stream:
            gen = GenerationRequest(**{**gen.__dict__, "include_usage": True})
        framer = ResponseFramer(gen, s.enable_prompt_tokens_details, self.fingerprint)
        base_id = base_id_of(gen.kind, request.headers.get("X-Request-Id"), framer.id)
        leg = await prepare_leg(self.nixl, body, gen, base_id)
        if leg.error is not None:
            return await failed_leg_response(request, gen.stream, leg.error)
        try:
            stream = await self.start(gen, framer.id, leg)
        except RequestError as exc:
            return error_response(exc)
        try:
            if gen.stream:
                return await self._stream(request, stream, framer, leg)
            return await self._collect(stream, framer, leg)
        finally:
            if stream.finished is None:
                self.engine.abort(framer.id)  # client went away (handler cancelled) or write failed

    async def start(self, gen: GenerationRequest, request_id: str, leg: Leg = PLAIN) -> TokenStream:
        """Submit a validated generation as every generation route does: the fault policy first, the seed of
        woken weights, the adapter it names once loaded, its P/D ``leg`` (`engine_sim.pd_legs`). RequestError when
        it is refused."""
        if self.sleep is not None and self.sleep.seed_shift:  # woken with other weights: other tokens
            gen = GenerationRequest(**{**gen.__dict__, "seed": gen.seed + self.sleep.seed_shift})
        action = self.faults.on_request()
        if action.crash:
            self.crash()
        elif action.error is not None:
            raise action.error
        adapter = gen.model if gen.model not in self.settings.served_model_names else None
        arrived = None if adapter is None else await self.engine.adapter_ready(adapter)
        if leg.arrived is not None:  # a decode leg's pull came first: it counts in the request's TTFT
            arrived = leg.arrived
        return self.engine.submit(leg.apply(gen.to_sim_request(request_id)), arrived=arrived, adapter=adapter)

    async def _collect(self, stream: TokenStream, framer: ResponseFramer, leg: Leg) -> web.Response:
        tokens, finish = await collect(stream)
        if stream.error is not None:
            return error_response(_engine_failed(stream.error))
        req = stream.request
        framer.kv_transfer_params = leg.offer(req)
        return _json(framer.body(tokens, finish, req.num_prompt_tokens, leg.cached_tokens(req.num_cached_tokens)))

    async def _stream(
        self, request: web.Request, stream: TokenStream, framer: ResponseFramer, leg: Leg
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        req = stream.request
        prompt_tokens = req.num_prompt_tokens
        try:
            while True:
                tokens, finish = await stream.next_batch()
                if not response.prepared:
                    await response.prepare(request)  # headers only with the first token (after prefill)
                if stream.error is not None:
                    await response.write(framer.error_event(_engine_failed(stream.error)))
                    break
                await response.write(framer.chunks(tokens, None if finish is None else finish.value, prompt_tokens))
                if finish is not None:
                    leg.offer(req)  # leased; a stream does not carry the parameters
                    await response.write(framer.closing(prompt_tokens, leg.cached_tokens(req.num_cached_tokens)))
                    break
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the finally in _generate aborts the request
        return response

    def crash(self) -> None:
        self.engine.kill(ENGINE_DEAD_MESSAGE)
        self.on_crash()


@web.middleware
async def _fastapi_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """A route that does not exist (or a method it lacks) answers as vLLM's FastAPI app does: JSON ``detail``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, status=405)


def _middlewares(settings: ServerSettings, faults: FaultSpec) -> list[Callable[..., Awaitable[web.StreamResponse]]]:
    out: list[Callable[..., Awaitable[web.StreamResponse]]] = [_fastapi_errors]
    if faults.hang:

        @web.middleware
        async def hang(request: web.Request, handler: _Handler) -> web.StreamResponse:
            del request, handler  # Unused: the request is accepted and never answered.
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        out.append(hang)
    if settings.api_key is not None:
        expected = f"Bearer {settings.api_key}".encode()

        @web.middleware
        async def auth(request: web.Request, handler: _Handler) -> web.StreamResponse:
            if request.path.startswith(("/v1", "/v2", "/inference")) and not hmac.compare_digest(
                request.headers.get("Authorization", "").encode(), expected
            ):
                return _json({"error": "Unauthorized"}, status=401)
            return await handler(request)

        out.append(auth)
    if settings.enable_request_id_headers:

        @web.middleware
        async def request_id(request: web.Request, handler: _Handler) -> web.StreamResponse:
            rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
            response = await handler(request)
            if not response.prepared:
                response.headers["X-Request-Id"] = rid
            return response

        out.append(request_id)
    return out


def create_app(
    engine: Engine,
    settings: ServerSettings,
    faults: FaultPolicy | None = None,
    on_crash: Callable[[], None] = lambda: None,
    on_die: Callable[[], None] = lambda: None,
    sleep: SleepController | None = None,
    dev_routes: bool = False,
    runner: str = "generate",
    nixl: NixlConnector | None = None,
) -> web.Application:
    """The aiohttp app; run it with ``web.AppRunner(app, handler_cancellation=True)`` so disconnects abort.
    ``sleep``: serve the sleep-mode routes over that controller (None: they do not exist, as without
    ``VLLM_SERVER_DEV_MODE=1``); ``dev_routes``: serve vLLM's other development route, ``/reset_prefix_cache``;
    ``runner`` ``pooling``: serve ``/v1/embeddings`` and no generation route, as vLLM's ``--runner pooling``;
    ``nixl``: the engine's NixlConnector (``--kv-transfer-config``), which chat and completion requests'
    ``kv_transfer_params`` drive (`engine_sim.pd_legs`)."""
    policy = faults or FaultPolicy(FaultSpec())
    routes = _Routes(engine, settings, policy, on_crash, on_die, sleep, nixl)
    app = web.Application(middlewares=_middlewares(settings, policy.spec), client_max_size=64 * 1024**2)
    app.router.add_get("/health", routes.health)
    app.router.add_route("*", "/ping", routes.health)
    app.router.add_get("/version", routes.version)
    app.router.add_get("/load", routes.load)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/v1/models", routes.models)
    if runner == "pooling":
        app.router.add_post("/v1/embeddings", routes.embeddings)
    else:
        app.router.add_post("/v1/chat/completions", routes.chat)
        app.router.add_post("/v1/completions", routes.completions)
        s = settings
        names = routes.model_names
        abort = engine.abort
        ResponsesApi(routes.start, abort, names, s.max_model_len, s.tokenizer, s.responses_store).add_routes(app)
        MessagesApi(routes.start, abort, names, s.max_model_len, s.tokenizer).add_routes(app)
        add_tokenize_routes(app, names, s.max_model_len, s.tokenizer, error_response)
    if dev_routes:
        app.router.add_post("/reset_prefix_cache", routes.reset_prefix_cache)
    if sleep is not None:
        add_sleep_routes(app, sleep, lambda status, message: error_response(RequestError(status, message)))
    return app
