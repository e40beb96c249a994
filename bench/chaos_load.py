"""Chaos load: open-loop streamed chat completions whose every answer is checked word for word.

Each request is a streamed chat completion (aiohttp, one keep-alive pool like the openai client's) with a fixed
``max_tokens`` and a ``seed``: the simulated engine's word at sequence position P depends only on the seed and P
(`engine_sim.tokenizer.filler_ids`), so the whole answer is known before it is sent, and a stream that was
resumed on another engine must still read exactly as that answer (no gap, no repeat). Every request ends as one of

* ``completed``: HTTP 200, a ``finish_reason``, ``data: [DONE]``, no error event, and exactly the expected text;
* ``error`` (a clear error): an HTTP status other than 200, an SSE error event, or no response at all (refused,
  reset before the status line): the client knows the request failed;
* ``truncated`` (silent): HTTP 200 and no error event, but the stream ended without ``finish_reason`` and
  ``[DONE]`` (cut, including a connection closed mid-body), stalled past the client's timeout, or its text is not
  the expected one (a gap or a repeat).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engine_sim.tokenizer import APPROX, SimTokenizer

__all__ = ["Load", "Outcome"]

_WORDS = "fleet replica gateway token cache queue engine batch prefill decode latency model tenant route".split()
STALL_S = 30.0  # no byte for this long: the client gives up on the stream


@dataclass
class Outcome:
    """One request as the client saw it."""

    index: int
    expected: str
    sent_at: float
    status: int | None = None  # None: no response arrived
    replica: str = ""  # the gateway's x-llmfleet-replica header
    transport: str | None = None  # exception class when the connection failed or stalled
    detail: str = ""  # its message
    error_code: int | str | None = None  # the SSE error event's code
    event_error: bool = False
    parts: list[str] = field(default_factory=list)
    finish: str | None = None
    done: bool = False
    first_at: float | None = None
    ended_at: float | None = None

    @property
    def verdict(self) -> str:
        if self.ended_at is None:
            return "pending"
        if self.status != 200 or self.event_error:
            return "error"
        if self.done and self.finish is not None and self.transport is None and "".join(self.parts) == self.expected:
            return "completed"
        return "truncated"

    @property
    def kind(self) -> str:
        """What went wrong, in a few words (for the notes)."""
        if self.status is None:
            return f"no response ({self.transport}: {self.detail})"
        if self.status != 200:
            return f"HTTP {self.status}"
        if self.event_error:
            return f"error event {self.error_code}"
        if self.transport == "TimeoutError":
            return "stalled"
        if not (self.done and self.finish is not None) or self.transport is not None:
            return "cut" + (f" ({self.transport})" if self.transport else "")
        return "gap or repeat in the text"

    @property
    def server_error(self) -> bool:
        """A 5xx status, or an error event carrying a 5xx code."""
        if self.status is not None and self.status >= 500:
            return True
        code = self.error_code
        return self.event_error and str(code).isdigit() and int(str(code)) >= 500


def _body(
    rng: random.Random, index: int, model: str, tokenizer: SimTokenizer, max_tokens: tuple[int, int] = (64, 192)
) -> tuple[dict[str, Any], str]:
    """A request and the answer the simulator gives it, uninterrupted (its words depend on where the prompt ends,
    as ``tokenizer``, the engines' own, counts it)."""
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 60)))
    messages = [{"role": "user", "content": f"Question {index}: {words}?"}]
    tokens, seed = rng.randint(*max_tokens), rng.randrange(1000)
    start = len(tokenizer.chat_prompt_ids(messages))
    expected = tokenizer.filler_text(tokenizer.filler_ids(seed, start, tokens))
    body = {"model": model, "messages": messages, "max_tokens": tokens, "seed": seed, "stream": True}
    return body, expected


class Load:
    """Poisson arrivals at ``rps`` (changeable while it runs) to ``url`` until `stop`, then waits for the
    requests in flight (each bounded by the client's stall timeout). Each asks for ``max_tokens`` drawn uniformly
    from that range (changeable too)."""

    def __init__(self, url: str, key: str, model: str, rps: float, seed: int, tokenizer: SimTokenizer = APPROX) -> None:
        self.url, self.key, self.model, self.rps = url, key, model, rps
        self.max_tokens = (64, 192)
        self.tokenizer = tokenizer  # the engines' (``engine.tokenizer``): the expected text depends on it
        self.rng = random.Random(seed)
        self.outcomes: list[Outcome] = []
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def streaming(self, replica: str | None = None) -> list[Outcome]:
        """Streams under way now (first token seen, not ended), on ``replica`` when given."""
        return [
            o
            for o in self.outcomes
            if o.first_at is not None and o.ended_at is None and (replica is None or o.replica == replica)
        ]

    def counts(self) -> Counter[str]:
        return Counter(o.verdict for o in self.outcomes)

    async def wait_streaming(self, count: int, timeout_s: float) -> int:
        """Wait until ``count`` streams are under way (or the timeout); returns how many are."""
        deadline = time.monotonic() + timeout_s
        while len(self.streaming()) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return len(self.streaming())

    async def run(self) -> None:
        # Idle connections are dropped after 5 s, as the openai client (httpx) does: aiohttp's own 15 s outlives the
        # gateway's idle keep-alive (timeouts.headerReadS, 10 s), and a request written into a connection the
        # gateway is closing fails without a response.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=5.0)
        headers = {"Authorization": f"Bearer {self.key}"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=STALL_S)
        async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
            tasks: set[asyncio.Task[None]] = set()
            loop = asyncio.get_running_loop()
            next_send = loop.time()
            while not self._stop.is_set():
                while next_send <= loop.time():
                    body, expected = _body(self.rng, len(self.outcomes), self.model, self.tokenizer, self.max_tokens)
                    outcome = Outcome(len(self.outcomes), expected, time.monotonic())
                    self.outcomes.append(outcome)
                    task = asyncio.create_task(self._one(session, body, outcome))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    next_send += self.rng.expovariate(self.rps)
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, min(0.1, next_send - loop.time())))
                except TimeoutError:
                    pass
            if tasks:
                await asyncio.wait(set(tasks))

    async def _one(self, session: aiohttp.ClientSession, body: dict[str, Any], out: Outcome) -> None:
        try:
            async with session.post(self.url + "/v1/chat/completions", json=body) as response:
                out.status = response.status
                out.replica = response.headers.get("x-llmfleet-replica", "")
                if response.status != 200:
                    await response.read()
                    return
                async for raw in response.content:
                    self._event(raw.decode(errors="replace").strip(), out)
        except (aiohttp.ClientError, TimeoutError) as exc:
            out.transport = type(exc).__name__
            out.detail = str(exc)[:100]
        except ValueError as exc:  # an event that is not JSON
            out.transport = "bad event"
            out.detail = str(exc)[:100]
        finally:
            out.ended_at = time.monotonic()

    @staticmethod
    def _event(line: str, out: Outcome) -> None:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            out.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            out.event_error = True
            out.error_code = chunk["error"].get("code")
            return
        for choice in chunk.get("choices", []):
            text = (choice.get("delta") or {}).get("content")
            if text:
                out.parts.append(text)
                if out.first_at is None:
                    out.first_at = time.monotonic()
            out.finish = choice.get("finish_reason") or out.finish
