"""Exchanges: one probe sent to one engine, and its answer reduced to what the comparison reads.

An answer is its status, its media type and its body: parsed JSON, the list of server-sent events (each its
``event:`` name, or None, and its ``data:`` parsed as JSON where it is JSON: ``[DONE]`` stays a string), text, or
nothing. Exchanges are plain data, so a run can be written to a file and compared again without the engines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from tests.differential.corpus import Probe

__all__ = ["Exchange", "parse_sse", "send"]


@dataclass(frozen=True)
class Exchange:
    probe: str
    status: int
    media_type: str
    kind: str  # "json", "sse", "text", "empty" or "error" (no answer: the transport error's name)
    body: Any

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Exchange:
        return cls(**value)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Server-sent events in order: ``{"event": name or None, "data": JSON value or the raw string}``."""
    events: list[dict[str, Any]] = []
    name: str | None = None
    data: list[str] = []
    for line in [*text.splitlines(), ""]:
        if not line:
            if data:
                raw = "\n".join(data)
                try:
                    value: Any = json.loads(raw)
                except ValueError:
                    value = raw
                events.append({"event": name, "data": value})
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return events


def send(client: httpx.Client, base: str, probe: Probe, earlier: Mapping[str, Exchange], key: str) -> Exchange:
    """Send ``probe`` to the engine at ``base`` (``earlier``: this engine's answers so far, for probes that follow
    up on one) and read the whole answer."""
    headers = {"authorization": f"Bearer {key}"} if probe.auth else {}
    body = probe.json_body(earlier)
    path = probe.url_path(earlier)
    content = probe.raw.encode() if probe.raw is not None else None
    try:
        answer = client.request(
            probe.method,
            base + path,
            json=body if content is None else None,
            content=content,
            headers={**headers, **({"content-type": "application/json"} if content is not None else {})},
        )
    except httpx.TransportError as exc:  # refused, reset, cut short: how the engine failed is the answer
        return Exchange(probe.name, 0, "", "error", type(exc).__name__)
    media = answer.headers.get("content-type", "").split(";")[0].strip()
    text = answer.text
    if not text:
        return Exchange(probe.name, answer.status_code, media, "empty", None)
    if media == "text/event-stream":
        return Exchange(probe.name, answer.status_code, media, "sse", parse_sse(text))
    try:
        return Exchange(probe.name, answer.status_code, media, "json", json.loads(text))
    except ValueError:
        return Exchange(probe.name, answer.status_code, media, "text", text)
