"""Responses: vLLM's ``/v1/responses`` routes on a generative server (`vllm/entrypoints/openai/responses/`; 0.32
measured by the differential suite, 0.33 read).

* ``POST /v1/responses``: ``input`` (a string, or a list of ``{role, content}`` message items) after
  ``instructions`` as a system message; ``max_output_tokens``; ``previous_response_id`` puts the stored
  conversation first, its system messages left out (instructions do not carry over); ``stream``; ``store``
  (default true); ``background``. Each runs as a chat request through the engine.
* ``GET /v1/responses/{id}`` answers the stored response; ``POST /v1/responses/{id}/cancel`` cancels a queued or
  running background response (200 with ``status: "cancelled"``), and any other is a 400.
* The store is off unless ``VLLM_ENABLE_RESPONSES_API_STORE=1``, as in vLLM: ``store: true`` is then quietly
  dropped (a later GET or follow-up is a 404) and ``background: true`` is a 400. It lives in the process and
  nothing expires (vLLM warns of the same): a restarted engine has forgotten every response.
* An unknown id (GET, cancel or ``previous_response_id``) is a 404 "Response with id '<id>' not found."
* Streams are ``event: <type>\\ndata: <json>\\n\\n`` with ``sequence_number`` from 0 and no ``[DONE]``:
  ``response.created``, ``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
  one ``response.output_text.delta`` per token, ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``, ``response.completed`` (also for an ``incomplete`` response, as 0.32 sends it).
  An engine failure mid-way sends an ``error`` event. Ids are vLLM's: ``resp_`` and ``msg_`` with 16 hex digits.

* A background response made with ``stream: true`` answers its events as they come, and ``GET
  /v1/responses/{id}?stream=true&starting_after=N`` replays them after event N and follows it to its end.

Not simulated (400): other input item types (tool calls and their outputs), tools; a replay of a response not made
in the background with ``stream`` (vLLM fails it after its 200 headers).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine_sim.engine import TokenStream, collect
from engine_sim.errors import RequestError
from engine_sim.protocol import GenerationRequest, dumps, parse_generation_request
from engine_sim.responses_wire import MessageEvents, ResponseShape, bad, input_messages, new_id, not_found
from engine_sim.tokenizer import SimTokenizer

__all__ = ["STORE_ENV", "ResponsesApi", "store_enabled"]

STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
Start = Callable[[GenerationRequest, str], Awaitable[TokenStream]]
Abort = Callable[[str], None]


def store_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """vLLM's own reading of the switch: an integer, 0 by default."""
    try:
        return bool(int(env.get(STORE_ENV, "0")))
    except ValueError:
        return False


@dataclass
class _Stored:
    response: dict[str, Any]
    messages: list[dict[str, str]]  # the conversation without system messages, the answer last
    task: asyncio.Task[None] | None = field(default=None, repr=False)  # a background response's run
    events: list[bytes] | None = None  # a streamed background response's events, for its replays
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def replay(self, response: web.StreamResponse, after: int) -> None:
        """Write the events numbered above ``after``, then each new one until the run ends."""
        assert self.events is not None
        sent = max(0, after + 1)
        while True:
            changed = self.changed
            if sent < len(self.events):
                await response.write(b"".join(self.events[sent:]))
                sent = len(self.events)
            if self.done and sent >= len(self.events):
                return
            await changed.wait()


class ResponsesApi:
    """The three routes over one engine; ``start`` submits a generation as the server's other routes do."""

    def __init__(
        self,
        start: Start,
        abort: Abort,
        served_names: tuple[str, ...],
        max_model_len: int,
        tokenizer: SimTokenizer,
        store: bool,
    ) -> None:
        self.start, self.abort = start, abort
        self.served_names, self.max_model_len = served_names, max_model_len
        self.tokenizer, self.store_on = tokenizer, store
        self.stored: dict[str, _Stored] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._create)
        app.router.add_get("/v1/responses/{response_id}", self._retrieve)
        app.router.add_post("/v1/responses/{response_id}/cancel", self._cancel)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        try:
            run = self._prepare(_loads(await request.read()))
            if run.background:
                queued = self._background(run)
                return _json(queued) if not run.gen.stream else await self._replay(request, self.stored[run.id], -1)
            stream = await self.start(run.gen, run.id)
        except RequestError as exc:
            return _json(exc.to_json(), exc.status)
        try:
            if run.gen.stream:
                return await self._stream(request, run, stream)
            tokens, finish = await collect(stream)
            if stream.error is not None:
                return _json(_failed(stream.error).to_json(), 500)
            return _json(self._finish(run, stream, tokens, finish))
        finally:
            if stream.finished is None:
                self.abort(run.id)  # the client went away (handler cancelled) or a write failed

    async def _retrieve(self, request: web.Request) -> web.StreamResponse:
        response_id = request.match_info["response_id"]
        held = self.stored.get(response_id)
        if held is None:
            return _json(not_found(response_id).to_json(), 404)
        if request.query.get("stream", "false").lower() != "true":
            return _json(held.response)
        if held.events is None:  # vLLM fails such a replay after its 200 headers; the simulator says why first
            return _json(
                bad("only a response made with background and stream replays as a stream", "stream").to_json(), 400
            )
        try:
            after = int(request.query.get("starting_after", "-1"))
        except ValueError:
            return _json(bad("starting_after must be an integer", "starting_after").to_json(), 400)
        return await self._replay(request, held, after)

    async def _replay(self, request: web.Request, held: _Stored, after: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        try:
            await held.replay(response, after)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # a reader that leaves does not stop the run
        return response

    async def _cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        held = self.stored.get(response_id)
        if held is None:
            return _json(not_found(response_id).to_json(), 404)
        if held.response["status"] not in ("queued", "in_progress") or held.task is None:
            return _json(bad("Cannot cancel a synchronous response.", "response_id").to_json(), 400)
        held.task.cancel()
        held.response = {**held.response, "status": "cancelled"}
        return _json(held.response)

    # -- one response --------------------------------------------------------------------------------------
    def _prepare(self, body: Any) -> _Run:
        if not isinstance(body, dict):
            raise bad("Request body must be a JSON object")
        store, background = body.get("store", True) is not False, body.get("background") is True
        if background and not store:
            raise RequestError(400, "background can only be used when `store` is true", "Bad Request", "background")
        if background and not self.store_on:
            raise bad(
                "This vLLM engine does not support `store=True` and therefore does not support the background "
                f"mode. To enable these features, set the environment variable `{STORE_ENV}=1` when launching "
                "the vLLM server.",
                "background",
            )
        if body.get("tools"):
            raise bad("the simulator does not call tools", "tools")
        if "input" not in body:
            raise RequestError(400, "1 validation error: input: Field required", "Bad Request", "body.input")
        instructions = body.get("instructions")
        history: list[dict[str, str]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            held = self.stored.get(str(previous))
            if held is None:
                raise not_found(str(previous))
            history = list(held.messages)
        new = input_messages(body["input"])
        system = [{"role": "system", "content": str(instructions)}] if isinstance(instructions, str) else []
        chat = {"model": body.get("model"), "messages": system + history + new, "stream": body.get("stream", False)}
        for ours, theirs in (
            ("max_tokens", "max_output_tokens"), ("seed", "seed"), ("ignore_eos", "ignore_eos"), ("cache_salt",) * 2
        ):  # fmt: skip
            if body.get(theirs) is not None:
                chat[ours] = body[theirs]
        gen = parse_generation_request(chat, "chat", self.served_names, self.max_model_len, self.tokenizer)
        run_id = new_id("resp")
        shape = ResponseShape(run_id, gen.model, body, gen.max_tokens, str(previous) if previous else None)
        kept = [m for m in history + new if m["role"] != "system"]
        return _Run(run_id, gen, shape, kept, store and self.store_on, background)

    def _finish(
        self, run: _Run, stream: TokenStream, tokens: list[int], finish: str, message_id: str | None = None
    ) -> dict[str, Any]:
        text = self.tokenizer.filler_text(tokens)
        req = stream.request
        prompt, cached = req.num_prompt_tokens, max(0, req.num_cached_tokens)
        response = run.shape.final(text, finish, prompt, len(tokens), cached, message_id)
        if run.store:
            messages = [*run.messages, {"role": "assistant", "content": text}]
            held = self.stored.get(run.id)
            if held is None:
                self.stored[run.id] = _Stored(response, messages)
            elif held.response["status"] != "cancelled":  # a background run ends
                held.response, held.messages = response, messages
        return response

    def _background(self, run: _Run) -> dict[str, Any]:
        """Queue ``run`` as a task of its own; a streamed one logs its events for the replays."""
        queued = run.shape.object("queued", [], None)
        held = self.stored[run.id] = _Stored(queued, [], events=[] if run.gen.stream else None)

        async def work() -> None:
            try:
                stream = await self.start(run.gen, run.id)
                try:
                    async for _ in self._frames(run, stream, MessageEvents(held.events)):
                        held.notify()
                finally:
                    if stream.finished is None:
                        self.abort(run.id)  # cancelled
                if stream.error is not None:
                    held.response = {**held.response, "status": "failed"}
            except RequestError:
                held.response = {**held.response, "status": "failed"}
            finally:
                held.done = True
                held.notify()

        held.task = asyncio.get_running_loop().create_task(work())
        return queued

    async def _frames(self, run: _Run, stream: TokenStream, events: MessageEvents) -> AsyncIterator[bytes]:
        """The stream's events as the engine's steps produce them, the response finished (and kept) at the end."""
        tokens: list[int] = []
        while True:
            batch, finish = await stream.next_batch()
            if events.sequence == 0:
                yield events.opening(run.shape.object("in_progress", [], None))
            if stream.error is not None:
                yield events.emit("error", code="InternalServerError", message=stream.error)
                return
            chunk = events.deltas([self.tokenizer.token_text(token) for token in batch])
            tokens.extend(batch)
            if finish is not None:
                chunk += events.closing(self._finish(run, stream, tokens, finish.value, events.item_id))
            if chunk:
                yield chunk
            if finish is not None:
                return

    async def _stream(self, request: web.Request, run: _Run, stream: TokenStream) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        try:
            async for chunk in self._frames(run, stream, MessageEvents()):
                if not response.prepared:
                    await response.prepare(request)  # headers only with the first events (after prefill)
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the caller's finally aborts the request
        return response


@dataclass(frozen=True)
class _Run:
    id: str
    gen: GenerationRequest
    shape: ResponseShape
    messages: list[dict[str, str]]  # what a follow-up replays: the conversation so far, no system message
    store: bool
    background: bool


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad(f"Invalid JSON body: {type(exc).__name__}") from None


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def _failed(message: str) -> RequestError:
    return RequestError(500, message, "InternalServerError")
