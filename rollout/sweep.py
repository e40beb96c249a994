"""Sweep: the same requests, at the same instants, against several engines, one offered rate after another.

A *profile* is a fixed list of chat requests drawn once from a seed and the pool's token mix (prompt and output
lengths spread lognormally around ``workload`` means), so every engine and every run sees identical work. Each
*step* offers a Poisson arrival schedule at ``rate x per-replica rate`` and sends each arrival to every target at
the same moment (side by side: a noisy host slows both alike). Requests stream; per request the sweep records
the time to the first content token (TTFT) and the mean gap between the following ones (TPOT, time per output
token: vLLM's ``request_time_per_output_token``). The per-request mean rather than every single gap: single gaps
as a client sees them are bunched by TCP and by the host's scheduling (several tokens read at once, then a
pause), which would make their p99 measure the network and the host instead of the engine.

Engines may run on a scaled clock (the simulator's ``--time-scale``): figures are converted to the engine's own
clock (wall seconds x time scale) and rates to requests per engine second, so a sweep on a slowed simulator
measures what the modelled GPU would do while the host sends fewer events per second.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["PendingStep", "Profile", "StepResult", "Target", "client", "make_profile", "quantile", "run_step"]

_WORDS = "fleet replica gateway token cache queue engine batch prefill decode latency model tenant route".split()


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str  # the engine's (or a gateway's) root, e.g. http://127.0.0.1:8000
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class Profile:
    bodies: tuple[Mapping[str, Any], ...]

    def body(self, i: int, model: str) -> dict[str, Any]:
        return {**self.bodies[i % len(self.bodies)], "model": model}


def make_profile(prompt_tokens: int, output_tokens: int, n: int, seed: int) -> Profile:
    """``n`` streamed chat requests around the given means (one word ~ one token for the simulator)."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(n):
        words = max(1, int(rng.lognormvariate(math.log(max(1, prompt_tokens)), 0.5)))
        text = " ".join(rng.choice(_WORDS) for _ in range(words))
        bodies.append(
            {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max(1, int(rng.lognormvariate(math.log(max(1, output_tokens)), 0.4))),
                # The output length is the profile's, not the model's choice: the same work on both sides.
                "ignore_eos": True,
                "stream": True,
            }
        )
    return Profile(tuple(bodies))


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (no interpolation: with few samples p99 is the largest but one or two)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class StepResult:
    """One target's requests in one step; latencies in engine seconds."""

    rate_rps: float  # offered, requests per engine second
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)  # per request: (last token - first token) / (tokens - 1)
    output_tokens: int = 0

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / self.sent if self.sent else 0.0


async def _one(
    client: httpx.AsyncClient, target: Target, body: dict[str, Any], result: StepResult, scale: float
) -> None:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    start = time.monotonic()
    first: float | None = None
    last = 0.0
    tokens = 0
    try:
        async with client.stream(
            "POST", f"{target.base_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                result.errors[str(response.status_code)] += 1
                return
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                if line.strip() == "data: [DONE]":
                    done = True
                    break
                if '"content":' not in line or '"content":""' in line:
                    continue  # the role delta and the final usage chunk carry no token
                last = time.monotonic() - start
                if first is None:
                    first = last
                tokens += 1
    except httpx.HTTPError as exc:
        result.errors[type(exc).__name__] += 1
        return
    if not done or first is None:
        result.errors["stream"] += 1
        return
    result.ok += 1
    result.ttft_s.append(first * scale)
    if tokens > 1:
        result.tpot_s.append((last - first) / (tokens - 1) * scale)
    result.output_tokens += tokens


class PendingStep:
    """A step whose arrivals have all been sent; `finished` waits for their answers."""

    def __init__(self, results: dict[str, StepResult], tasks: list[asyncio.Task[None]]) -> None:
        self._results = results
        self._tasks = tasks

    async def finished(self) -> dict[str, StepResult]:
        await asyncio.gather(*self._tasks)
        return self._results


def client(timeout_s: float = 300.0) -> httpx.AsyncClient:
    """The client a sweep sends with: no connection cap (an open-loop sender must not queue at its own pool)."""
    return httpx.AsyncClient(
        timeout=timeout_s, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
    )


async def run_step(
    client: httpx.AsyncClient,
    targets: Sequence[Target],
    profile: Profile,
    rate_rps: float,
    requests: int,
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    offset: int = 0,
) -> PendingStep:
    """Offer ``requests`` Poisson arrivals at ``rate_rps`` (engine time) to every target at once; returns when
    the last is sent.

    ``offset`` picks where in the profile this step starts, so consecutive steps send different prompts (a prefix
    cache does not turn a later step into repeats of an earlier one)."""
    results = {t.name: StepResult(rate_rps) for t in targets}
    wall_rate = rate_rps * time_scale
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    tasks = []
    at = loop.time()
    for i in range(requests):
        await asyncio.sleep(max(0.0, at - loop.time()))
        for target in targets:
            body = profile.body(offset + i, target.model)
            results[target.name].sent += 1
            tasks.append(asyncio.create_task(_one(client, target, body, results[target.name], time_scale)))
        at += rng.expovariate(wall_rate)
    return PendingStep(results, tasks)
