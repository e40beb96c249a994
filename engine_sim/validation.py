"""Validation: the request errors vLLM raises before a request reaches the engine, in vLLM's words.

Two sources, as in vLLM (0.32 measured, 0.33 read: the same code):

* The body's schema (FastAPI and pydantic): a body that is no JSON, or lacks a required field, is a 400 whose
  ``type`` is ``"Bad Request"``, whose ``param`` is pydantic's location (``body.messages``, or ``body.<offset>`` of
  a JSON syntax error) and whose message is ``1 validation error:`` and the error's dict (`schema_error`).
* The sampling parameters (``SamplingParams._verify_args`` in ``vllm/sampling_params.py``): ``BadRequestError``
  with the parameter named, and vLLM's ``VLLMValidationError`` suffix ``(parameter=..., value=...)`` where vLLM
  gives both (`check_sampling`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from engine_sim.errors import RequestError

__all__ = ["check_sampling", "json_body", "missing_field", "schema_error", "validation_error"]


def schema_error(kind: str, loc: str, msg: str, given: Any, ctx: Mapping[str, str] | None = None) -> RequestError:
    """pydantic's error for the body, as vLLM's server renders it."""
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": given}
    if ctx:
        detail["ctx"] = dict(ctx)
    return RequestError(400, f"1 validation error:\n  {detail!r}", "Bad Request", loc)


def json_body(raw: bytes) -> Any:
    """The body parsed; a JSON syntax error is pydantic's ``json_invalid`` at the offending offset."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise schema_error(
            "json_invalid", f"body.{exc.pos}", "JSON decode error", "<dict of 0 items>", {"error": exc.msg}
        ) from None


def missing_field(body: Mapping[str, Any], name: str) -> RequestError:
    return schema_error("missing", f"body.{name}", "Field required", f"<dict of {len(body)} items>")


def validation_error(message: str, parameter: str | None = None, value: Any = None) -> RequestError:
    """vLLM's ``VLLMValidationError``: the message, then ``(parameter=..., value=...)`` for what it names."""
    extras = [f"parameter={parameter}"] if parameter is not None else []
    extras += [f"value={value}"] if value is not None else []
    text = f"{message} ({', '.join(extras)})" if extras else message
    return RequestError(400, text, "BadRequestError", parameter)


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise schema_error("float_parsing", f"body.{name}", "Input should be a valid number", value)
    return float(value)


def check_sampling(body: Mapping[str, Any], max_tokens: int | None) -> None:
    """``SamplingParams._verify_args``'s checks of what the simulator reads, in its order and words."""
    temperature = _number(body, "temperature", 1.0)
    top_p = _number(body, "top_p", 1.0)
    if not math.isfinite(temperature):
        raise validation_error(f"temperature must be a finite number, got {temperature}.", "temperature", temperature)
    if temperature < 0.0:
        raise validation_error(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
    if temperature > 2.0:
        raise validation_error(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
    if not 0.0 < top_p <= 1.0:
        raise validation_error(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    if max_tokens is not None and max_tokens < 1:
        raise validation_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    n = body.get("n")
    if isinstance(n, int) and n > 1 and temperature < 1e-5:  # vLLM's _SAMPLING_EPS: greedy
        raise RequestError(400, f"n must be 1 when using greedy sampling, got {n}.", "BadRequestError", None)
