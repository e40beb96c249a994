"""vLLM's ``POST /tokenize`` over the simulator's tokenizer.

``/tokenize`` takes a completion's ``prompt`` (special tokens added unless ``add_special_tokens`` is false) or a
chat's ``messages`` (rendered with the chat template, the generation prompt added unless
``add_generation_prompt`` is false) and answers ``{"count", "max_model_len", "tokens", "token_strs"}``. The ids
are the ones the generation routes count (the same tokenizer), as vLLM's are; errors are vLLM's 400/404. Not
simulated: ``token_strs`` (always null: the simulator's tokenizers name only their filler words) and
``/detokenize``; the product uses neither.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from engine_sim.errors import RequestError
from engine_sim.protocol import dumps, served_model
from engine_sim.tokenizer import SimTokenizer
from engine_sim.validation import json_body, missing_field
from fleet.tokenizer import ChatRenderError

__all__ = ["add_tokenize_routes"]

_Reply = Callable[[RequestError], web.Response]


def add_tokenize_routes(
    app: web.Application, names: Sequence[str], max_model_len: int, tokenizer: SimTokenizer, error: _Reply
) -> None:
    def route(fn: Callable[[Any], dict[str, Any]]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = json_body(await request.read())
                served_model(body, names)
                return web.json_response(fn(body), dumps=dumps)
            except RequestError as exc:
                return error(exc)

        return handle

    def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        try:
            if "messages" in body:
                ids = tokenizer.chat_prompt_ids(
                    body["messages"],
                    add_generation_prompt=body.get("add_generation_prompt", True) is not False,
                    add_special_tokens=body.get("add_special_tokens", False) is True,
                )
            elif "prompt" in body:
                ids = tokenizer.encode(str(body["prompt"]), add_special_tokens=body.get("add_special_tokens", True))
            else:
                raise missing_field(body, "prompt")
        except ChatRenderError as exc:
            raise RequestError(400, str(exc), "BadRequestError", "messages") from None
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}

    app.router.add_post("/tokenize", route(tokenize))
