"""Streams: greedy chat streams and a steady load through a gateway, recording every failure a client would see."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import TracebackType
from typing import Self

import httpx

from fleet.protocol.keys import DEMO_API_KEY
from tests.vllm.conftest import SERVED

__all__ = ["Greedy", "SteadyLoad", "read_stream"]

HEADERS = {"Authorization": f"Bearer {DEMO_API_KEY}"}


async def read_stream(
    client: httpx.AsyncClient,
    body: dict[str, object],
    on_response: Callable[[httpx.Response], None] | None = None,
    on_content: Callable[[str], None] | None = None,
) -> tuple[str, str | None]:
    """One streamed chat completion: (its text, None) or (what it got, why it failed as a client sees it: a
    status, an error event, an abort, no ``[DONE]``). ``on_response`` sees the answer's head, ``on_content``
    each piece of text as it arrives."""
    text: list[str] = []
    done = False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
            if on_response is not None:
                on_response(answer)
            if answer.status_code != 200:
                return "", f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}"
            async for line in answer.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return "".join(text), f"error event {event['error']}"
                for choice in event.get("choices", ()):
                    piece = choice.get("delta", {}).get("content") or ""
                    text.append(piece)
                    if on_content is not None and piece:
                        on_content(piece)
                    if choice.get("finish_reason") == "abort":
                        return "".join(text), "finish_reason abort"
    except httpx.HTTPError as exc:
        return "".join(text), f"{type(exc).__name__}: {exc}"
    return "".join(text), None if done else "no [DONE]"


class Greedy:
    """``count`` greedy (temperature 0) chat streams of ``max_tokens``, one prompt each, all at once."""

    def __init__(self, gateway: str, count: int = 16, max_tokens: int = 600) -> None:
        self.gateway, self.count, self.max_tokens = gateway, count, max_tokens
        self.started = asyncio.Event()
        self.failures: list[tuple[str, str]] = []
        self.replicas: dict[str, str] = {}  # prompt -> the replica that first answered it (x-llmfleet-replica)

    def prompts(self) -> list[str]:
        return [f"stream {n}: tell the story of replica {n}" for n in range(self.count)]

    async def run(self, on_started: Callable[[int], bool] | None = None) -> dict[str, str]:
        """Each prompt's text. ``on_started`` gets the number of streams with a first token so far; `started` is
        set once it says True (each run starts afresh)."""
        self.started.clear()
        self.failures = []
        self.replicas = {}
        first = 0

        async def one(client: httpx.AsyncClient, prompt: str) -> tuple[str, str]:
            body = {"model": SERVED, "stream": True, "max_tokens": self.max_tokens, "temperature": 0,
                    "ignore_eos": True, "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
            counted = False

            def started(piece: str) -> None:
                del piece  # Unused: the first piece of text is what counts.
                nonlocal counted, first
                if not counted:
                    counted, first = True, first + 1
                    if on_started is not None and on_started(first):
                        self.started.set()

            def head(answer: httpx.Response) -> None:
                self.replicas[prompt] = answer.headers.get("x-llmfleet-replica", "")

            text, failure = await read_stream(client, body, on_response=head, on_content=started)
            if failure:
                self.failures.append((prompt, failure))
            return prompt, text

        async with httpx.AsyncClient(base_url=self.gateway, headers=HEADERS, timeout=300) as client:
            results = await asyncio.gather(*(one(client, p) for p in self.prompts()))
        return dict(results)


class SteadyLoad:
    """``clients`` clients each sending short greedy streams back to back until the context ends; `failures`
    lists what any of them saw go wrong."""

    def __init__(self, gateway: str, clients: int = 4, max_tokens: int = 16) -> None:
        self.gateway, self.clients, self.max_tokens = gateway, clients, max_tokens
        self.ok = 0
        self.failures: list[str] = []
        self._checked = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _client(self, n: int) -> None:
        async with httpx.AsyncClient(base_url=self.gateway, headers=HEADERS, timeout=120) as client:
            i = 0
            while not self._stop.is_set():
                body = {"model": SERVED, "stream": True, "max_tokens": self.max_tokens,
                        "messages": [{"role": "user", "content": f"client {n} request {i}"}]}  # fmt: skip
                _, failure = await read_stream(client, body)
                if failure:
                    self.failures.append(failure)
                else:
                    self.ok += 1
                i += 1

    async def served(self) -> bool:
        """True once a few more requests succeeded since the last call."""
        if self.ok >= self._checked + 2 * self.clients:
            self._checked = self.ok
            return True
        return False

    async def __aenter__(self) -> Self:
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self.clients)]
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
