"""Raw HTTP: requests written byte for byte on a socket, for what an HTTP client would refuse to send.

    request(method, target, headers, body=b"") -> bytes     one HTTP/1.1 request that asks for Connection: close
    exchange(url, data, timeout_s=10) -> Answer             send it, read until the server closes, parse the answer
    Answer.error                                            the OpenAI error object of its JSON body

Headers are (name, value) byte pairs, in order and repeatable, so a test can send a header twice or a byte that is
not ASCII.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Answer", "Header", "exchange", "open_raw", "request"]

Header = tuple[bytes, bytes]


@dataclass(frozen=True)
class Answer:
    """A parsed response: status, headers (names lower-cased, the last of a repeated one) and body as sent."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def error(self) -> dict[str, Any]:
        """The ``error`` object of an OpenAI error body; AssertionError naming the answer when it is not one."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        document = json.loads(self.body)
        assert isinstance(document, dict) and list(document) == ["error"], self
        error = document["error"]
        assert sorted(error) == ["code", "message", "param", "type"], self
        return dict(error)

    @property
    def anthropic_error(self) -> dict[str, Any]:
        """The ``error`` object of an Anthropic error body (``{"type": "error", "error": {type, message}}``)."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        document = json.loads(self.body)
        assert isinstance(document, dict) and document.get("type") == "error" and list(document) == ["type", "error"]
        error = document["error"]
        assert sorted(error) == ["message", "type"], self
        return dict(error)

    def error_for(self, path: str) -> dict[str, Any]:
        """The error object in the shape of the API ``path`` belongs to: Anthropic's on ``/v1/messages``, except
        for a request the HTTP parser refused before its path was known (OpenAI's shape, as on every other path)."""
        if path.startswith("/v1/messages") and json.loads(self.body).get("type") == "error":
            return self.anthropic_error
        return self.error


def request(method: str, target: bytes | str, headers: list[Header], body: bytes = b"") -> bytes:
    """One request with ``Host`` and ``Connection: close``; ``headers`` as given (no Content-Length is added)."""
    path = target.encode() if isinstance(target, str) else target
    lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: gateway", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def open_raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain TCP connection to ``url``'s host and port."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return await asyncio.open_connection(parts.hostname, parts.port)


def parse(raw: bytes) -> Answer:
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {raw[:300]!r}"
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(url: str, data: bytes, timeout_s: float = 10.0) -> Answer:
    """Send ``data`` on a new connection to ``url`` and read the answer until the server closes the connection."""
    reader, writer = await open_raw(url)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    return parse(raw)
