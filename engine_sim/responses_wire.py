"""Responses wire: the request's input as chat messages, and the response object and stream events vLLM's
``/v1/responses`` answers with (`vllm/entrypoints/openai/responses/protocol.py`, ``streaming_events.py``; 0.32
measured by the differential suite, 0.33 read).

* `input_messages`: ``input`` as a string (one user message) or a list of ``{role, content}`` message items, the
  content a string or text parts; other item types are not simulated (400).
* `ResponseShape`: the response object, every field present with nulls kept as vLLM dumps it (the sampling
  penalties, ``kv_transfer_params``, ``ec_transfer_params``, ``input_messages`` and ``output_messages`` among them);
  ``status`` ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` when the output ran to its
  limit; the usage in ``input_tokens`` / ``output_tokens`` with vLLM's details (cache writes, tool output and the
  per-turn lists, all zero or empty for one plain turn). A message item carries ``phase: null`` and no ``summary``.
* `MessageEvents`: one streamed message as ``event: <type>\ndata: <json>\n\n`` numbered from 0, its item under a
  ``msg_`` id that the completed response at the end keeps, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine_sim.errors import RequestError
from engine_sim.protocol import dumps

__all__ = ["MessageEvents", "ResponseShape", "bad", "input_messages", "new_id", "not_found"]


def new_id(prefix: str) -> str:
    """vLLM's ids: a prefix and 16 hex digits (``random_uuid()``)."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def bad(message: str, param: str | None = None, type_: str = "invalid_request_error") -> RequestError:
    return RequestError(400, message, type_, param)


def not_found(response_id: str) -> RequestError:
    return RequestError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", "response_id")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)  # input_text / output_text parts
    raise bad("message content must be a string or a list of text parts", "input")


def input_messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("input must be a string or a non-empty list of input items", "input")
    messages = []
    for item in value:
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            raise bad("the simulator takes message items only ({role, content})", "input")
        messages.append({"role": str(item["role"]), "content": _text(item.get("content"))})
    return messages


@dataclass(frozen=True)
class ResponseShape:
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
            "usage": usage, "user": None, "presence_penalty": _penalty(b, "presence_penalty"),
            "frequency_penalty": _penalty(b, "frequency_penalty"), "kv_transfer_params": None,
            "ec_transfer_params": None, "input_messages": None, "output_messages": None,
        }  # fmt: skip

    def final(
        self, text: str, finish: str, prompt: int, completion: int, cached: int, message_id: str | None = None
    ) -> dict[str, Any]:
        """The finished response; ``message_id`` is a streamed message's (else a new one)."""
        content: list[dict[str, Any]] = (
            [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}] if text else []
        )
        message = message_item(message_id or new_id("msg"), "completed", content)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + completion,
        }  # fmt: skip
        incomplete = finish == "length"
        response = self.object("incomplete" if incomplete else "completed", [message], usage)
        if incomplete:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant message output item (``phase`` is vLLM's, null outside a multi-phase answer)."""
    return {"id": item_id, "type": "message", "role": "assistant", "content": content, "status": status, "phase": None}


def _penalty(body: dict[str, Any], name: str) -> float:
    value = body.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


class MessageEvents:
    """The SSE events of one streamed message, numbered from 0."""

    def __init__(self, log: list[bytes] | None = None) -> None:
        """``log``: every event emitted is also appended there (a background response's, for its replays)."""
        self.log = log
        self.sequence = 0
        self.item_id = new_id("msg")
        self.where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        self.texts: list[str] = []

    def emit(self, type_: str, **fields: Any) -> bytes:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        framed = f"event: {type_}\ndata: {dumps(event)}\n\n".encode()
        if self.log is not None:
            self.log.append(framed)
        return framed

    def opening(self, started: dict[str, Any]) -> bytes:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return (
            self.emit("response.created", response=started)
            + self.emit("response.in_progress", response=started)
            + self.emit(
                "response.output_item.added", output_index=0, item=message_item(self.item_id, "in_progress", [])
            )
            + self.emit("response.content_part.added", **self.where, part=part)
        )

    def deltas(self, texts: list[str]) -> bytes:
        self.texts.extend(texts)
        return b"".join(self.emit("response.output_text.delta", **self.where, delta=t, logprobs=[]) for t in texts)

    def closing(self, final: dict[str, Any]) -> bytes:
        text = "".join(self.texts)
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
        item = message_item(self.item_id, "completed", [part])
        return (
            self.emit("response.output_text.done", **self.where, text=text, logprobs=[])
            + self.emit("response.content_part.done", **self.where, part=part)
            + self.emit("response.output_item.done", output_index=0, item=item)
            + self.emit("response.completed", response=final)
        )
