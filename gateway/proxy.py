"""Proxy: one attempt of a request on one engine, over the gateway's single pooled aiohttp client.

aiohttp was chosen by measurement (``bench/gateway_overhead.py``): on this machine a minimal proxy cost about
4 ms of CPU per request with httpx and about 0.5 ms with aiohttp.

* `send_json` (``stream: false``): POST and read the whole answer within ``timeouts.totalS``; an answer the
  engine ended with ``finish_reason: "abort"`` (a vLLM shutting down) is a retryable `UpstreamUnavailable`.
* Both classify a refusal here, where the answer is read: a 503 is `UpstreamUnavailable`; vLLM's 500
  ``cannot schedule new futures after shutdown`` (it is draining) is `UpstreamDraining`; any other non-200 is
  `UpstreamStatus`, relayed as it came. The callers branch on those classes only.
* `open_stream` (``stream: true``): POST and wait for the first complete SSE event within
  ``timeouts.firstTokenS``; nothing has reached the client yet, so every failure up to here may be retried.
* `SseRelay`: splits the rest of the upstream bytes into events only to count them, spot ``[DONE]`` and read
  ``usage`` from the one event carrying it (found by a substring test, so ordinary chunks are never parsed);
  it drops the usage event when the client did not ask for it (the gateway adds
  ``stream_options.include_usage`` upstream to account tokens).

Failures are raised as `gateway.errors.UpstreamError` subclasses; the caller decides about retries.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fleet.protocol.openai_error import error_body
from gateway.errors import (
    UpstreamConnectError,
    UpstreamDiedEarly,
    UpstreamDraining,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.resume import aborted

__all__ = [
    "CONNECTION_BROKEN",
    "DONE_MARKERS",
    "MESSAGES_END",
    "RESPONSES_END",
    "event_data",
    "JsonAnswer",
    "SseRelay",
    "Timeouts",
    "Usage",
    "open_stream",
    "send_json",
    "sse_error_event",
]

# What aiohttp raises when an engine's connection breaks during a request or its answer.
CONNECTION_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@dataclass(frozen=True)
class Timeouts:
    connect_s: float
    first_token_s: float
    total_s: float


@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def of(cls, payload: Any) -> Usage:
        """The usage of an OpenAI answer or chunk (``prompt_tokens``), or of a Responses or Anthropic answer or
        event (``input_tokens``; in a ``response`` or ``message`` object of the event, when it carries one)."""
        if not isinstance(payload, dict):
            return cls()
        usage = payload.get("usage")
        for key in ("response", "message"):
            inner = payload.get(key)
            if not isinstance(usage, dict) and isinstance(inner, dict):
                usage = inner.get("usage")
        if not isinstance(usage, dict):
            return cls()
        if "input_tokens" in usage:
            return cls(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")))
        return cls(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class JsonAnswer:
    status: int
    body: bytes
    content_type: str
    usage: Usage


def sse_error_event(message: str, type_: str = "upstream_error", code: int = 502) -> bytes:
    """The in-band error vLLM itself sends: an error event, then ``[DONE]``."""
    return b"data: " + error_body(message, type_, code) + b"\n\ndata: [DONE]\n\n"


# What ends a stream properly, by the API it speaks: OpenAI's ``[DONE]``; the Responses API's last event (its
# ``response.completed``, or ``.incomplete`` / ``.failed``); Anthropic's ``message_stop``.
DONE_MARKERS = (b"data: [DONE]",)
RESPONSES_END = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")
MESSAGES_END = (b"event: message_stop",)


def event_data(event: bytes) -> bytes | None:
    """The ``data:`` line's content of one SSE event (after any ``event:`` line); None without one."""
    if event.startswith(b"data:"):
        return event[5:].split(b"\n", 1)[0]
    at = event.find(b"\ndata:")
    return None if at < 0 else event[at + 6 :].split(b"\n", 1)[0]


# What vLLM 0.32 answers, as HTTP 500, to every request that arrives while it drains with --shutdown-timeout > 0: its
# renderer's thread pool is shut down first (`UpstreamDraining`). Python's executors word it so; it never means
# anything but "refused before it started".
_DRAINING_500 = b"cannot schedule new futures after shutdown"


def _died(exc: Exception) -> UpstreamDiedEarly:
    return UpstreamDiedEarly(str(exc) or type(exc).__name__)


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], timeouts: Timeouts
) -> aiohttp.ClientResponse:
    try:
        resp = await session.post(
            url,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=timeouts.connect_s),
        )
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamConnectError(str(exc)) from exc
    except aiohttp.ConnectionTimeoutError as exc:
        # No connection within timeouts.connectS (a TimeoutError too, which open_stream would take for the
        # first-token deadline): the request never reached the engine, so another replica may take it.
        raise UpstreamConnectError(f"no connection within {timeouts.connect_s:g}s") from exc
    except CONNECTION_BROKEN as exc:
        raise _died(exc) from exc
    if resp.status == 200:
        return resp
    try:
        payload = await resp.read()
    except aiohttp.ClientError as exc:
        raise _died(exc) from exc
    finally:
        resp.release()
    if resp.status == 503:
        raise UpstreamUnavailable("engine answered 503")
    if resp.status == 500 and _DRAINING_500 in payload:
        raise UpstreamDraining("engine answered 500 'cannot schedule new futures after shutdown' (it is draining)")
    raise UpstreamStatus(resp.status, payload, resp.headers.get("Content-Type", "application/json"))


def _aborted(payload: bytes) -> bool:
    """Whether a JSON answer ends a choice with ``finish_reason: "abort"`` (`gateway.resume.aborted`)."""
    try:
        answer = json.loads(payload)
    except ValueError:
        return False
    return isinstance(answer, dict) and aborted(answer)


async def send_json(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], timeouts: Timeouts
) -> JsonAnswer:
    """One non-streaming attempt."""
    try:
        async with asyncio.timeout(timeouts.total_s):
            resp = await _post(session, url, body, headers, timeouts)
            try:
                payload = await resp.read()
            except CONNECTION_BROKEN as exc:
                resp.close()
                raise _died(exc) from exc
    except TimeoutError:
        raise UpstreamTimeout(f"no answer within {timeouts.total_s:g}s") from None
    if b'"abort"' in payload and _aborted(payload):
        # vLLM ends what it has not finished at its --shutdown-timeout, and what arrives while it shuts down, with
        # finish_reason "abort" (HTTP 200): nothing reached the client yet, so another replica answers it.
        raise UpstreamUnavailable("the engine aborted the request (finish_reason abort: it is stopping)")
    usage = Usage()
    if b'"usage"' in payload:
        try:
            usage = Usage.of(json.loads(payload))
        except ValueError:
            pass
    return JsonAnswer(200, payload, resp.headers.get("Content-Type", "application/json"), usage)


@dataclass
class SseRelay:
    """State of one relayed stream: leftover bytes, events seen, usage, whether ``[DONE]`` arrived."""

    resp: aiohttp.ClientResponse
    hide_usage: bool
    ends: tuple[bytes, ...] = DONE_MARKERS  # what ends the stream properly (`DONE_MARKERS`, `RESPONSES_END`, ...)
    buffer: bytes = b""
    events: int = 0
    done: bool = False
    usage: Usage = field(default_factory=Usage)
    error_code: int | None = None  # the code of an error event the engine sent in-band (5xx when it gave none)

    def feed(self, data: bytes) -> bytes:
        """Append upstream bytes; return the complete events to send on (possibly b"")."""
        self.buffer += data
        cut = self.buffer.rfind(b"\n\n")
        if cut < 0:
            return b""
        complete, self.buffer = self.buffer[: cut + 2], self.buffer[cut + 2 :]
        self.events += complete.count(b"\n\n")
        for end in self.ends:  # a loop, not any() over a generator: this runs for every chunk relayed
            if end in complete:
                self.done = True
        if b'"error"' in complete:
            self._spot_error(complete)
        if b'"usage"' in complete:
            complete = self._take_usage(complete)
        return complete

    def _spot_error(self, complete: bytes) -> None:
        for event in complete.split(b"\n\n"):
            data = event_data(event) if b'"error"' in event else None
            if data is None:
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            if not isinstance(payload, dict):
                continue
            error = payload.get("error")
            if isinstance(error, dict):
                code = error.get("code")
                self.error_code = code if isinstance(code, int) and 400 <= code < 600 else 500
            elif payload.get("type") == "error":  # the Responses API's error event: its fields at the top
                self.error_code = 500

    def _take_usage(self, complete: bytes) -> bytes:
        kept: list[bytes] = []
        for event in complete.split(b"\n\n")[:-1]:
            data = event_data(event) if b'"usage"' in event else None
            if data is not None:
                try:
                    payload = json.loads(data)
                except ValueError:
                    payload = None
                found = Usage.of(payload)
                if found.completion_tokens is not None:
                    self.usage = found
                    if self.hide_usage and isinstance(payload, dict) and not payload.get("choices"):
                        continue
            kept.append(event + b"\n\n")
        return b"".join(kept)

    async def first(self) -> bytes:
        """Bytes up to and including the first complete event; UpstreamDiedEarly when the stream ends first."""
        try:
            while True:
                data = await self.resp.content.readany()
                if not data:
                    raise UpstreamDiedEarly("stream closed before the first token")
                out = self.feed(data)
                if out:
                    return out
        except CONNECTION_BROKEN as exc:
            raise _died(exc) from exc


async def open_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeouts: Timeouts,
    hide_usage: bool,
    ends: tuple[bytes, ...] = DONE_MARKERS,
) -> tuple[SseRelay, bytes]:
    """One streaming attempt up to its first event: (relay for the rest, bytes to send first).

    One deadline, ``timeouts.firstTokenS``, covers connecting, the response head and the first event.
    """
    relay: SseRelay | None = None
    try:
        async with asyncio.timeout(timeouts.first_token_s):
            resp = await _post(session, url, body, headers, timeouts)
            relay = SseRelay(resp, hide_usage, ends)
            first = await relay.first()
    except TimeoutError:
        if relay is not None:
            relay.resp.close()
        raise UpstreamTimeout(f"no first token within {timeouts.first_token_s:g}s") from None
    except BaseException:
        if relay is not None:
            relay.resp.close()
        raise
    return relay, first
