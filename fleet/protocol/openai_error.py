"""OpenAI error: the one error body every llmfleet HTTP API answers with.

    {"error": {"message": str, "type": str, "param": str | null, "code": int | str | null}}

The gateway, the control plane, the agent and the engine simulator all render errors through `error_body`
(or the `OpenAIError` model in a typed API), so a client parses one shape whichever part refused it.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorDetail", "OpenAIError", "error_body", "error_dict"]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(frozen=True)

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class OpenAIError(BaseModel):
    """The whole error document (also the response model in the control APIs' OpenAPI documents)."""

    model_config = ConfigDict(frozen=True)

    error: ErrorDetail


def error_dict(message: str, type_: str, code: int | str | None, param: str | None = None) -> dict[str, object]:
    """The error document as a dict (for JSON responses built by a framework)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_body(message: str, type_: str, code: int | str | None, param: str | None = None) -> bytes:
    """The error document as UTF-8 JSON bytes (plain json: it is on the gateway's hot path)."""
    return json.dumps(error_dict(message, type_, code, param)).encode()
