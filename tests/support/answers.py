"""Answers: what a well-behaved server answers any request body with, checked for the HTTP fuzz tests.

A 200 (a JSON answer holding its kind's result, or an SSE stream that ends as its API ends one and carries no
error event) or a 4xx with an error body: OpenAI's ``{"error": {message, type, param, code}}``, or on Anthropic's
route Anthropic's ``{"type": "error", "error": {type, message}}`` (vLLM's own request validation answers there in
OpenAI's shape). Never a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.body import PATHS
from tests.support.openai_bodies import Kind

__all__ = ["PATHS", "check_answer"]

_ANSWER_KEY = {
    "chat": "choices",
    "completion": "choices",
    "embedding": "data",
    "response": "output",
    "message": "content",
    "count": "input_tokens",
}
# The event that ends a stream of each kind that does not end with [DONE].
_LAST_EVENT = {"response": ("response.completed", "response.incomplete"), "message": ("message_stop",)}


def _check_error(kind: Kind, status: int, document: Any, code_is_status: bool) -> None:
    if kind in ("message", "count") and isinstance(document, dict) and document.get("type") == "error":
        assert list(document) == ["type", "error"] and sorted(document["error"]) == ["message", "type"], document
        return
    assert isinstance(document, dict) and list(document) == ["error"], document
    error = document["error"]
    assert sorted(error) == ["code", "message", "param", "type"], error
    assert isinstance(error["message"], str) and isinstance(error["type"], str), error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], int | str), error
    assert not code_is_status or error["code"] == status, error


def check_answer(kind: Kind, status: int, content_type: str, body: bytes, *, code_is_status: bool = False) -> None:
    """AssertionError unless the answer is one a well-behaved server gives (``code_is_status``: vLLM's errors,
    whose ``code`` is the HTTP status)."""
    assert status < 500, body[:300]
    if status >= 400:
        _check_error(kind, status, json.loads(body), code_is_status)
        return
    assert status == 200, body[:300]
    if not content_type.startswith("text/event-stream"):
        assert json.loads(body)[_ANSWER_KEY[kind]] is not None, body[:300]
        return
    blocks = [block for block in body.decode().split("\n\n") if block]
    if kind in _LAST_EVENT:  # "event: <type>" then "data: <json>", no [DONE]
        assert blocks and blocks[-1].startswith(tuple(f"event: {e}\n" for e in _LAST_EVENT[kind])), body[-300:]
        assert not any(block.startswith("event: error") for block in blocks), body[-300:]
        return
    events = [block[6:] for block in blocks if block.startswith("data: ")]
    assert events and events[-1] == "[DONE]", body[-300:]
    for event in events[:-1]:
        assert "error" not in json.loads(event), event
