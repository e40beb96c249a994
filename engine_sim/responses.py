"""Responses: vLLM 0.33's ``/v1/responses`` routes on a generative server (`vllm/entrypoints/openai/responses/`).

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
  one ``response.output_text.delta`` per engine step, ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``, ``response.completed``. An engine failure mid-way sends an ``error`` event.

Not simulated (400): other input item types (tool calls and their outputs), tools, a streamed background
response and the replay of a stored one (``GET ?stream=true``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine_sim.engine import TokenStream, collect
from engine_sim.errors import RequestError
from engine_sim.protocol import GenerationRequest, dumps, parse_generation_request
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


def _bad(message: str, param: str | None = None, type_: str = "invalid_request_error") -> RequestError:
    return RequestError(400, message, type_, param)


def _not_found(response_id: str) -> RequestError:
    return RequestError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", "response_id")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)  # input_text / output_text parts
    raise _bad("message content must be a string or a list of text parts", "input")


def _input_messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("input must be a string or a non-empty list of input items", "input")
    messages = []
    for item in value:
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            raise _bad("the simulator takes message items only ({role, content})", "input")
        messages.append({"role": str(item["role"]), "content": _text(item.get("content"))})
    return messages


@dataclass
class _Stored:
    response: dict[str, Any]
    messages: list[dict[str, str]]  # the conversation without system messages, the answer last
    task: asyncio.Task[None] | None = field(default=None, repr=False)


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
                return _json(self._background(run))
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

    async def _retrieve(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if request.query.get("stream", "false").lower() == "true":
            return _json(_bad("the simulator does not replay stored responses as streams", "stream").to_json(), 400)
        held = self.stored.get(response_id)
        if held is None:
            return _json(_not_found(response_id).to_json(), 404)
        return _json(held.response)

    async def _cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        held = self.stored.get(response_id)
        if held is None:
            return _json(_not_found(response_id).to_json(), 404)
        if held.response["status"] not in ("queued", "in_progress") or held.task is None:
            return _json(_bad("Cannot cancel a synchronous response.", "response_id").to_json(), 400)
        held.task.cancel()
        held.response = {**held.response, "status": "cancelled"}
        return _json(held.response)

    # -- one response --------------------------------------------------------------------------------------
    def _prepare(self, body: Any) -> _Run:
        if not isinstance(body, dict):
            raise _bad("Request body must be a JSON object")
        store, background = body.get("store", True) is not False, body.get("background") is True
        if background and not store:
            raise RequestError(400, "background can only be used when `store` is true", "Bad Request", "background")
        if background and not self.store_on:
            raise _bad(
                "This vLLM engine does not support `store=True` and therefore does not support the background "
                f"mode. To enable these features, set the environment variable `{STORE_ENV}=1` when launching "
                "the vLLM server.",
                "background",
            )
        if background and body.get("stream") is True:
            raise _bad("the simulator does not stream background responses", "stream")
        if body.get("tools"):
            raise _bad("the simulator does not call tools", "tools")
        if "input" not in body:
            raise RequestError(400, "1 validation error: input: Field required", "Bad Request", "body.input")
        instructions = body.get("instructions")
        history: list[dict[str, str]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            held = self.stored.get(str(previous))
            if held is None:
                raise _not_found(str(previous))
            history = list(held.messages)
        new = _input_messages(body["input"])
        system = [{"role": "system", "content": str(instructions)}] if isinstance(instructions, str) else []
        chat = {"model": body.get("model"), "messages": system + history + new, "stream": body.get("stream", False)}
        for ours, theirs in (("max_tokens", "max_output_tokens"), ("seed", "seed"), ("ignore_eos", "ignore_eos")):
            if body.get(theirs) is not None:
                chat[ours] = body[theirs]
        gen = parse_generation_request(chat, "chat", self.served_names, self.max_model_len, self.tokenizer)
        run_id = f"resp_{uuid.uuid4().hex}"
        shape = _ResponseShape(run_id, gen.model, body, gen.max_tokens, str(previous) if previous else None)
        kept = [m for m in history + new if m["role"] != "system"]
        return _Run(run_id, gen, shape, kept, store and self.store_on, background)

    def _finish(self, run: _Run, stream: TokenStream, tokens: list[int], finish: str) -> dict[str, Any]:
        text = self.tokenizer.filler_text(tokens)
        req = stream.request
        response = run.shape.final(text, finish, req.num_prompt_tokens, len(tokens), max(0, req.num_cached_tokens))
        if run.store:
            held = self.stored.get(run.id)
            if held is None or held.response["status"] != "cancelled":
                self.stored[run.id] = _Stored(response, [*run.messages, {"role": "assistant", "content": text}])
        return response

    def _background(self, run: _Run) -> dict[str, Any]:
        queued = run.shape.object("queued", [], None)
        held = self.stored[run.id] = _Stored(queued, [])

        async def work() -> None:
            try:
                stream = await self.start(run.gen, run.id)
            except RequestError:
                held.response = {**held.response, "status": "failed"}
                return
            try:
                tokens, finish = await collect(stream)
            finally:
                if stream.finished is None:
                    self.abort(run.id)  # cancelled
            if stream.error is not None:
                held.response = {**held.response, "status": "failed"}
            else:
                self._finish(run, stream, tokens, finish)

        held.task = asyncio.get_running_loop().create_task(work())
        return queued

    async def _stream(self, request: web.Request, run: _Run, stream: TokenStream) -> web.StreamResponse:
        events = _MessageEvents()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        tokens: list[int] = []
        try:
            while True:
                batch, finish = await stream.next_batch()
                if not response.prepared:
                    await response.prepare(request)
                    await response.write(events.opening(run.shape.object("in_progress", [], None)))
                if stream.error is not None:
                    await response.write(events.emit("error", code="InternalServerError", message=stream.error))
                    break
                chunk = events.deltas([self.tokenizer.token_text(token) for token in batch])
                tokens.extend(batch)
                if finish is not None:
                    chunk += events.closing(self._finish(run, stream, tokens, finish.value))
                if chunk:
                    await response.write(chunk)
                if finish is not None:
                    break
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the caller's finally aborts the request
        return response


@dataclass(frozen=True)
class _ResponseShape:
    """The fields of one response object that do not change while it runs."""

    id: str
    model: str
    body: dict[str, Any]
    max_output_tokens: int
    previous_response_id: str | None
    created_at: int = field(default_factory=lambda: int(time.time()))

    def object(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id, "created_at": self.created_at, "incomplete_details": None,
            "instructions": b.get("instructions"), "metadata": b.get("metadata"), "model": self.model,
            "object": "response", "output": output, "parallel_tool_calls": True,
            "temperature": b.get("temperature", 1.0), "tool_choice": "none", "tools": [],
            "top_p": b.get("top_p", 1.0), "background": b.get("background") is True,
            "max_output_tokens": self.max_output_tokens, "max_tool_calls": None,
            "previous_response_id": self.previous_response_id, "prompt": None, "reasoning": None,
            "service_tier": "auto", "status": status, "text": None, "top_logprobs": None, "truncation": "disabled",
            "usage": usage, "user": None,
        }  # fmt: skip

    def final(self, text: str, finish: str, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = (
            [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}] if text else []
        )
        message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": "completed",
                   "content": content}  # fmt: skip
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        incomplete = finish == "length"
        response = self.object("incomplete" if incomplete else "completed", [message], usage)
        if incomplete:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response


@dataclass(frozen=True)
class _Run:
    id: str
    gen: GenerationRequest
    shape: _ResponseShape
    messages: list[dict[str, str]]  # what a follow-up replays: the conversation so far, no system message
    store: bool
    background: bool


class _MessageEvents:
    """The SSE events of one streamed message, numbered from 0."""

    def __init__(self) -> None:
        self.sequence = 0
        self.item_id = uuid.uuid4().hex  # vLLM streams its message item under a bare uuid
        self.where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        self.texts: list[str] = []

    def emit(self, type_: str, **fields: Any) -> bytes:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {type_}\ndata: {dumps(event)}\n\n".encode()

    def _item(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.item_id, "type": "message", "role": "assistant", "content": content, "status": status}

    def opening(self, started: dict[str, Any]) -> bytes:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return (
            self.emit("response.created", response=started)
            + self.emit("response.in_progress", response=started)
            + self.emit("response.output_item.added", output_index=0, item=self._item("in_progress", []))
            + self.emit("response.content_part.added", **self.where, part=part)
        )

    def deltas(self, texts: list[str]) -> bytes:
        self.texts.extend(texts)
        return b"".join(self.emit("response.output_text.delta", **self.where, delta=t, logprobs=[]) for t in texts)

    def closing(self, final: dict[str, Any]) -> bytes:
        text = "".join(self.texts)
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
        item = {**self._item("completed", [part]), "summary": []}
        return (
            self.emit("response.output_text.done", **self.where, text=text, logprobs=[])
            + self.emit("response.content_part.done", **self.where, part=part)
            + self.emit("response.output_item.done", output_index=0, item=item)
            + self.emit("response.completed", response=final)
        )


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _bad(f"Invalid JSON body: {type(exc).__name__}") from None


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def _failed(message: str) -> RequestError:
    return RequestError(500, message, "InternalServerError")
