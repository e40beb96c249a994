"""Messages: Anthropic's ``POST /v1/messages`` as vLLM serves it beside the OpenAI routes
(`vllm/entrypoints/anthropic/`, registered with the generate routes; 0.32 measured by the differential suite, 0.33
read).

* The request: ``model``, ``messages`` (``{role, content}``, content a string or a list of ``text`` blocks),
  ``max_tokens`` (required, > 0), ``system`` (a string or ``text`` blocks, one system message), ``stream``,
  ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` and ``metadata`` (accepted). It runs as a chat request.
  A body that fails the request schema (no ``max_tokens``, ``messages`` not a list, a message without a role...)
  gets vLLM's OpenAI-shaped 400, as FastAPI's validation answers before the Anthropic handler runs: ``type`` "Bad
  Request", ``param`` the first error's location (``body.max_tokens``) and the message ``N validation error(s):``
  and each pydantic error's dict, its ``input`` summarized as vLLM does (`_schema_failure`).
* The answer: ``{"id": "chatcmpl-...", "type": "message", "role": "assistant", "content": [{"type": "text",
  "text"}], "model", "stop_reason": "end_turn" | "max_tokens", "usage": {"input_tokens", "output_tokens"}}``, the
  null ``stop_sequence`` left out (vLLM dumps with ``exclude_none``); ``input_tokens`` is the prompt less its
  cached tokens.
* Streams are ``event: <name>\\ndata: <json>\\n\\n`` with no ``[DONE]`` and no ``ping``: ``message_start`` (its
  usage with the input tokens), ``content_block_start`` (with the first text), ``content_block_delta``
  (``text_delta``) per engine step, ``content_block_stop``, ``message_delta`` (``stop_reason``, a null
  ``stop_sequence`` and the usage), ``message_stop``.
* Errors the handler raises are ``{"type": "error", "error": {"type", "message"}}`` with vLLM's error type names
  and the status of the error (an unknown model: 404 ``NotFoundError``).

``POST /v1/messages/count_tokens`` answers ``{"input_tokens", "context_management": {"original_input_tokens"}}``
for the same body without ``max_tokens``, running nothing.

Not simulated (400): images, tools and thinking blocks. ``stop_sequences`` are accepted and never matched.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ValidationError

from engine_sim.engine import TokenStream, collect
from engine_sim.errors import RequestError
from engine_sim.protocol import GenerationRequest, dumps, parse_generation_request
from engine_sim.request import SimRequest
from engine_sim.tokenizer import SimTokenizer

__all__ = ["MessagesApi"]

Start = Callable[[GenerationRequest, str], Awaitable[TokenStream]]
Abort = Callable[[str], None]
_STOP = {"stop": "end_turn", "length": "max_tokens"}


class AnthropicMessage(BaseModel):  # vLLM's name, which its errors quote
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _CountRequest(BaseModel):
    """The schema vLLM's ``AnthropicCountTokensRequest`` checks before its handler, in its field order."""

    model: str
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None


class _MessagesRequest(BaseModel):
    """``AnthropicMessagesRequest``'s fields the simulator reads, in vLLM's order (pydantic reports in it)."""

    model: str
    messages: list[AnthropicMessage]
    max_tokens: int
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    system: str | list[dict[str, Any]] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


# pydantic's names for union branches and wrappers in an error's location, which vLLM drops from ``param``.
_INTERNAL = re.compile(r"[\[\]{}()]|^(str|int|float|bool|list|dict|none|union|tagged-union|function-\w+)$", re.I)


def _summary(value: Any) -> Any:
    """vLLM's bounded stand-in for an error's ``input`` (`_summarize_error_input`)."""
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not _INTERNAL.search(str(p)))


def _schema_failure(errors: list[dict[str, Any]]) -> web.Response:
    """FastAPI's validation failure as vLLM renders it (at most 10 errors of at most 1000 characters each):
    OpenAI-shaped, before the Anthropic handler; ``param`` is the first error's location."""
    lines = []
    for error in errors[:10]:
        text = str({**error, "loc": _where(error["loc"]), "input": _summary(error.get("input"))})
        lines.append(f"  {text[:1000]}...[truncated]" if len(text) > 1000 else f"  {text}")
    label = "error" if len(errors) == 1 else "errors"
    if len(errors) > 10:
        lines.append(f"  ...and {len(errors) - 10} more {label}")
    message = "\n".join([f"{len(errors)} validation {label}:", *lines])
    body = {"error": {"message": message, "type": "Bad Request", "param": _where(errors[0]["loc"]), "code": 400}}
    return web.json_response(body, status=400, dumps=dumps)


async def _validated(request: web.Request, schema: type[BaseModel]) -> dict[str, Any] | web.Response:
    """The body as a JSON object that passes ``schema``, else vLLM's validation failure."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {},
                 "ctx": {"error": exc.msg}}  # fmt: skip
        return _schema_failure([error])
    except (ValueError, RecursionError):
        return _schema_failure([{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error", "input": {}}])
    if not isinstance(body, dict):
        return _schema_failure([{"type": "model_attributes_type", "loc": ("body",),
                                 "msg": "Input should be a valid dictionary or object to extract fields from",
                                 "input": body}])  # fmt: skip
    try:
        schema.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        return _schema_failure(errors)
    return body


def _error(exc: RequestError) -> web.Response:
    body = {"type": "error", "error": {"type": exc.type, "message": exc.message}}
    return web.json_response(body, status=exc.status, dumps=dumps)


def _text(content: Any, field: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    raise RequestError(400, "the simulator takes text content blocks only", "BadRequestError", field)


class MessagesApi:
    """``POST /v1/messages`` over one engine; ``start`` submits a generation as the server's other routes do."""

    def __init__(
        self, start: Start, abort: Abort, served_names: tuple[str, ...], max_model_len: int, tokenizer: SimTokenizer
    ) -> None:
        self.start, self.abort = start, abort
        self.served_names, self.max_model_len, self.tokenizer = served_names, max_model_len, tokenizer

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._create)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """The prompt's tokens as ``/v1/messages`` would run it, without running it."""
        body = await _validated(request, _CountRequest)
        if isinstance(body, web.Response):
            return body
        try:
            gen = self._chat({**body, "max_tokens": 1, "stream": False})
        except RequestError as exc:
            return _error(exc)
        tokens = len(gen.prompt_token_ids)
        answer = {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
        return web.json_response(answer, dumps=dumps)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await _validated(request, _MessagesRequest)
        if isinstance(body, web.Response):
            return body
        try:
            gen = self._chat(body)
            message_id = f"chatcmpl-{uuid.uuid4().hex}"
            stream = await self.start(gen, message_id)
        except RequestError as exc:
            return _error(exc)
        try:
            if gen.stream:
                return await self._stream(request, gen, message_id, stream)
            tokens, finish = await collect(stream)
            if stream.error is not None:
                return _error(RequestError(500, stream.error, "InternalServerError"))
            req = stream.request
            content = [{"type": "text", "text": self.tokenizer.filler_text(tokens)}]
            usage = _usage(req, len(tokens))
            answer = {"id": message_id, "type": "message", "role": "assistant", "content": content,
                      "model": gen.model, "stop_reason": _STOP.get(finish, "end_turn"), "usage": usage}  # fmt: skip
            return web.json_response(answer, dumps=dumps)
        finally:
            if stream.finished is None:
                self.abort(message_id)  # the client went away (handler cancelled) or a write failed

    def _chat(self, body: dict[str, Any]) -> GenerationRequest:
        messages = body["messages"]
        if not messages:
            raise RequestError(400, "messages must be a non-empty list of message objects", "BadRequestError")
        chat_messages = [{"role": str(m.get("role")), "content": _text(m.get("content"), "messages")} for m in messages]
        if body.get("system") is not None:
            chat_messages.insert(0, {"role": "system", "content": _text(body["system"], "system")})
        if body.get("tools"):
            raise RequestError(400, "the simulator does not call tools", "BadRequestError", "tools")
        chat = {"model": body["model"], "messages": chat_messages, "max_tokens": int(body["max_tokens"]),
                "stream": body.get("stream") is True, "cache_salt": body.get("cache_salt")}  # fmt: skip
        for name in ("temperature", "top_p", "top_k"):  # checked as the chat request's sampling parameters
            if body.get(name) is not None:
                chat[name] = body[name]
        return parse_generation_request(chat, "chat", self.served_names, self.max_model_len, self.tokenizer)

    async def _stream(
        self, request: web.Request, gen: GenerationRequest, message_id: str, stream: TokenStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        req = stream.request
        opened = False
        count = 0
        try:
            while True:
                batch, finish = await stream.next_batch()
                chunk = b""
                if not response.prepared:
                    await response.prepare(request)
                    message: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant", "content": [],
                               "model": gen.model, "stop_reason": None, "stop_sequence": None,
                               "usage": _usage(req, 0)}  # fmt: skip
                    chunk += _event("message_start", message=message)
                if stream.error is not None:
                    error = {"type": "internal_error", "message": stream.error}
                    await response.write(chunk + _event("error", error=error))
                    break
                for token in batch:
                    text = self.tokenizer.token_text(token)
                    if not opened and text:
                        chunk += _event("content_block_start", content_block={"type": "text", "text": ""}, index=0)
                        opened = True
                    chunk += _event("content_block_delta", delta={"type": "text_delta", "text": text}, index=0)
                count += len(batch)
                if finish is not None:
                    usage = _usage(req, count)
                    if opened:
                        chunk += _event("content_block_stop", index=0)
                    chunk += _event(
                        "message_delta",
                        delta={"stop_reason": _STOP.get(finish.value, "end_turn"), "stop_sequence": None},
                        usage=usage,
                    )
                    chunk += _event("message_stop")
                await response.write(chunk)
                if finish is not None:
                    break
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the caller's finally aborts the request
        return response


def _usage(req: SimRequest, output_tokens: int) -> dict[str, int]:
    """vLLM's Anthropic usage: the prompt's tokens less those read from the prefix cache."""
    return {"input_tokens": req.num_prompt_tokens - max(0, req.num_cached_tokens), "output_tokens": output_tokens}


def _event(name: str, **fields: Any) -> bytes:
    return f"event: {name}\ndata: {dumps({'type': name, **fields})}\n\n".encode()
