"""Dialects: what differs between the APIs the gateway speaks, OpenAI's and Anthropic's, on the wire.

* **Errors.** OpenAI's routes answer ``{"error": {message, type, param, code}}``
  (`fleet.protocol.openai_error`); Anthropic's ``/v1/messages`` answers ``{"type": "error", "error": {type,
  message}}`` with Anthropic's error types (`anthropic_error_body`: ``invalid_request_error``,
  ``authentication_error``, ``permission_error``, ``not_found_error``, ``rate_limit_error``, ``overloaded_error``,
  ``timeout_error``, ``api_error``: those its client's ``ErrorType`` lists), so each client's own error classes
  see the gateway's refusals. What an engine answers is relayed as it is.
* **The end of a stream.** Chat and completions end with ``data: [DONE]``; a Responses stream with its
  ``response.completed`` event (or ``.incomplete`` / ``.failed``); a Messages stream with ``message_stop``. A
  stream that stops before its end failed.
* **A stream that fails after its first event** ends with the dialect's own error event: OpenAI's error chunk and
  ``[DONE]``; the Responses API's ``event: error`` (``{"type": "error", "code", "message", "param"}``);
  Anthropic's ``event: error`` (``{"type": "error", "error": {"type": "api_error", "message"}}``).
* **The key.** Anthropic's clients send it as ``x-api-key`` (or ``Authorization: Bearer`` with an auth token):
  `credential` reads either on ``/v1/messages`` and only ``Authorization`` elsewhere.
"""

from __future__ import annotations

import json

from aiohttp import web

from gateway.body import Kind
from gateway.call import authorization
from gateway.errors import GatewayError, MalformedHeader, Unauthorized
from gateway.proxy import DONE_MARKERS, MESSAGES_END, RESPONSES_END, sse_error_event

__all__ = ["ANTHROPIC_PATHS", "anthropic_error_body", "credential", "error_body_for", "stream_ends", "stream_error"]

ANTHROPIC_PATHS = ("/v1/messages",)
# The error types Anthropic's client knows (its ``ErrorType``), by the gateway's status; a 413 is an invalid request.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(message: str, status: int) -> bytes:
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def error_body_for(path: str, exc: GatewayError) -> bytes:
    """``exc`` in the error shape of the API that ``path`` belongs to."""
    if path.startswith(ANTHROPIC_PATHS):
        return anthropic_error_body(exc.message, exc.status)
    return exc.body()


def stream_ends(kind: Kind) -> tuple[bytes, ...]:
    return RESPONSES_END if kind == "response" else MESSAGES_END if kind == "message" else DONE_MARKERS


def stream_error(kind: Kind, message: str) -> bytes:
    """The event that ends a stream of ``kind`` which failed after its first event."""
    event: dict[str, object]
    if kind == "response":
        event = {"type": "error", "code": "upstream_error", "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    if kind == "message":
        event = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return sse_error_event(message)


def credential(request: web.Request) -> str | None:
    """The request's key as an ``Authorization`` value: Anthropic's ``x-api-key`` on its paths, when sent."""
    if request.path.startswith(ANTHROPIC_PATHS):
        keys = request.headers.getall("x-api-key", [])
        if len(keys) > 1:
            raise MalformedHeader("more than one x-api-key header", param="x-api-key")
        if keys and not keys[0].isascii():
            raise MalformedHeader("malformed x-api-key header: not ASCII", param="x-api-key")
        if keys and "Authorization" not in request.headers:
            return f"Bearer {keys[0].strip()}"
        if not keys and "Authorization" not in request.headers:
            raise Unauthorized("missing API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'")
    return authorization(request)
