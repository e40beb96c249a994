"""Dialects: the gateway's refusals on Anthropic's route use only the error types Anthropic's client knows."""

from __future__ import annotations

import json
import typing

import pytest
from anthropic.types.shared.error_type import ErrorType

from gateway.dialects import anthropic_error_body

# Every status the gateway refuses with (docs/gateway.md, "API").
STATUSES = [400, 401, 403, 404, 405, 408, 413, 415, 429, 431, 502, 503, 504]


@pytest.mark.parametrize("status", STATUSES)
def test_each_status_maps_to_an_error_type_of_anthropics_client(status: int) -> None:
    body = json.loads(anthropic_error_body("no", status))
    assert body == {"type": "error", "error": {"type": body["error"]["type"], "message": "no"}}
    assert body["error"]["type"] in typing.get_args(ErrorType), status
