"""Load: ``llmfleet load --rps R --duration S``: a realistic request mix through the gateway.

Open-loop Poisson arrivals at ``R`` requests per second (a slow fleet does not slow the sender down, as with real
users). The mix: 80% streamed chat completions, 20% non-streamed; prompts of lognormally spread length around
the pool's ``meanPromptTokens`` and a shared system prompt on half the requests (prefix-cache hits);
``max_tokens`` around ``meanOutputTokens``. A live progress line shows sent, ok, errors by status and p50/p99
TTFT (first streamed token); a summary is printed at the end, and written as JSON with ``--summary FILE``.

``--plot FILE.png`` also records the run second by second (`llmfleet.local.timeseries`: requests sent and completed,
TTFT and latency p50/p99, errors by status, and the ready replicas per pool polled from the control plane's
``/v1/pools``, the endpoint ``llmfleet status`` reads) and draws it (`llmfleet.local.plots`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fleet.protocol.control_auth import ClientCredential, Kind
from fleet.protocol.keys import DEMO_API_KEY
from fleet.spec.loader import load_or_report
from llmfleet.local.timeseries import Recorder

__all__ = ["LoadStats", "add_arguments", "run", "run_load"]

_WORDS = "fleet replica gateway token cache queue engine batch prefill decode latency model tenant route".split()
_SYSTEM = "You are a helpful assistant for an operations team. Answer briefly and precisely. " * 4


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class LoadStats:
    """Running totals; ``errors`` maps an HTTP status (or ``"conn"``/``"stream"``) to a count. With a
    ``recorder``, every request is also recorded with its times (seconds since ``started``)."""

    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    recorder: Recorder | None = None

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - sum(self.errors.values())

    def line(self) -> str:
        p50, p99 = _quantile(self.ttft_s, 0.5), _quantile(self.ttft_s, 0.99)
        errs = " ".join(f"{k}:{v}" for k, v in sorted(self.errors.items())) or "0"
        ttft = f"p50 {p50 * 1000:.0f}ms p99 {p99 * 1000:.0f}ms" if p50 is not None and p99 is not None else "-"
        elapsed = time.monotonic() - self.started
        return (
            f"[{elapsed:5.1f}s] sent {self.sent}  ok {self.ok}  errors {errs}  in-flight {self.in_flight}  TTFT {ttft}"
        )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sent": self.sent, "ok": self.ok, "errors": dict(self.errors)}
        out["duration_s"] = round(time.monotonic() - self.started, 3)
        for name, values in (("ttft", self.ttft_s), ("latency", self.latency_s)):
            for q in (0.5, 0.9, 0.99):
                value = _quantile(values, q)
                out[f"{name}_p{int(q * 100)}_ms"] = None if value is None else round(value * 1000, 1)
        return out

    def since_start(self) -> float:
        return time.monotonic() - self.started

    def add_error(self, status: str) -> None:
        self.errors[status] += 1
        if self.recorder is not None:
            self.recorder.on_error(self.since_start(), status)

    def add_ok(self, latency_s: float, ttft_s: float | None) -> None:
        if ttft_s is not None:
            self.ttft_s.append(ttft_s)
        self.latency_s.append(latency_s)
        self.ok += 1
        if self.recorder is not None:
            self.recorder.on_ok(self.since_start(), latency_s, ttft_s)


def _request(rng: random.Random, model: str, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    words = max(1, int(rng.lognormvariate(math.log(prompt_tokens), 0.5)))
    text = " ".join(rng.choice(_WORDS) for _ in range(words))
    messages = [{"role": "user", "content": text}]
    if rng.random() < 0.5:
        messages.insert(0, {"role": "system", "content": _SYSTEM})
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max(1, int(rng.lognormvariate(math.log(output_tokens), 0.4))),
        "stream": rng.random() < 0.8,
    }


async def _one(session: aiohttp.ClientSession, body: dict[str, Any], stats: LoadStats) -> None:
    start = time.monotonic()
    try:
        async with session.post("/v1/chat/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                stats.add_error(str(response.status))
                return
            first: float | None = None
            done = not body["stream"]
            async for raw in response.content:
                if body["stream"] and raw.startswith(b"data:"):
                    if first is None:
                        first = time.monotonic() - start
                    if raw.strip() == b"data: [DONE]":
                        done = True
            if not done:
                stats.add_error("stream")
                return
            stats.add_ok(time.monotonic() - start, first)
    except (aiohttp.ClientError, TimeoutError):
        stats.add_error("conn")


async def run_load(
    gateway: str,
    key: str,
    model: str,
    rps: float,
    duration_s: float,
    *,
    prompt_tokens: int = 200,
    output_tokens: int = 80,
    seed: int = 0,
    on_progress: Callable[[LoadStats], None] | None = None,
    stats: LoadStats | None = None,
    stop: asyncio.Event | None = None,
) -> LoadStats:
    """Send Poisson traffic at ``rps`` for ``duration_s`` (or until ``stop`` is set), then wait for every
    request in flight to finish: none is abandoned, so every request ends as ok or as a counted error."""
    rng = random.Random(seed)
    stats = stats or LoadStats()
    headers = {"Authorization": f"Bearer {key}"}
    # The client must cost far less than what it measures: httpx spent ~22 ms of CPU per streamed request here,
    # so at 30 req/s on two cores the sender itself stalled, then sent its backlog in waves (tripping the
    # tenant's requests/s bucket) that synchronised the whole fleet. aiohttp costs a fraction of that.
    connector = aiohttp.TCPConnector(limit=1000, limit_per_host=1000)
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with aiohttp.ClientSession(gateway, headers=headers, timeout=timeout, connector=connector) as client:
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        next_progress = loop.time()
        next_send = loop.time()
        while loop.time() < end and not (stop is not None and stop.is_set()):
            now = loop.time()
            while next_send <= now:
                task = asyncio.create_task(_one(client, _request(rng, model, prompt_tokens, output_tokens), stats))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                stats.sent += 1
                if stats.recorder is not None:
                    stats.recorder.on_sent(stats.since_start())
                next_send += rng.expovariate(rps) if rps > 0 else duration_s
            if on_progress is not None and now >= next_progress:
                on_progress(stats)
                next_progress = now + 0.5
            await asyncio.sleep(max(0.0, min(next_send, end, loop.time() + 0.1) - loop.time()))
        while tasks:
            await asyncio.wait(set(tasks), timeout=0.5)
            if on_progress is not None:
                on_progress(stats)
    return stats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rps", type=float, required=True, help="requests per second (Poisson arrivals)")
    parser.add_argument("--duration", type=float, required=True, help="seconds to send for")
    parser.add_argument("--stack", default="local", help="stack for defaults (gateway port, model, token mix)")
    parser.add_argument("--gateway", default=None, help="gateway URL (default: http://127.0.0.1:<gateway.port>)")
    parser.add_argument("--key", default=DEMO_API_KEY, help="API key (default: the local demo key)")
    parser.add_argument("--model", default=None, help="model (default: the first pool's served name)")
    parser.add_argument("--summary", type=Path, default=None, help="also write the summary as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="OUT.png", help="record the run per second and draw it as a PNG"
    )
    parser.add_argument(
        "--control-plane", default=None, help="where --plot reads ready replicas (default: from the stack)"
    )


async def poll_ready(
    control_plane: str,
    stats: LoadStats,
    stop: asyncio.Event,
    interval_s: float = 1.0,
    credential: ClientCredential | None = None,
) -> None:
    """Until ``stop``: every ``interval_s``, record each pool's ready replicas from ``GET /v1/pools`` (read with
    ``credential``) in ``stats.recorder``. A control plane that does not answer (or refuses: 401 without a
    credential) leaves a gap: unknown is not zero."""
    assert stats.recorder is not None
    timeout = aiohttp.ClientTimeout(total=min(1.0, interval_s))
    async with aiohttp.ClientSession(control_plane, timeout=timeout) as client:
        while not stop.is_set():
            try:
                headers = credential.headers() if credential is not None else None
                async with client.get("/v1/pools", raise_for_status=True, headers=headers) as response:
                    pools = (await response.json())["pools"]
                stats.recorder.on_ready(stats.since_start(), {p["pool"]: int(p["ready"]) for p in pools})
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError):
                pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)


async def _recorded(
    load: Awaitable[LoadStats], control_plane: str, stats: LoadStats, credential: ClientCredential | None
) -> LoadStats:
    """``load``, with the ready replicas polled alongside until it ends."""
    stop = asyncio.Event()
    poller = asyncio.create_task(poll_ready(control_plane, stats, stop, credential=credential))
    try:
        return await load
    finally:
        stop.set()
        await poller


def run(args: argparse.Namespace) -> int:
    loaded = load_or_report(args.stack)
    if loaded is None:
        return 2
    spec = loaded.spec
    pool = spec.pools[0]
    gateway = args.gateway or f"http://127.0.0.1:{spec.gateway.port}"
    model = args.model or pool.served_name
    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(stats: LoadStats) -> None:
        if tty:
            print("\r" + stats.line().ljust(100), end="", file=sys.stderr, flush=True)
        elif time.monotonic() - last[0] >= 5.0:
            last[0] = time.monotonic()
            print(stats.line(), file=sys.stderr, flush=True)

    print(f"sending {args.rps:g} req/s for {args.duration:g}s to {gateway} (model {model})", file=sys.stderr)
    stats = LoadStats(recorder=Recorder() if args.plot is not None else None)
    load = run_load(
        gateway,
        args.key,
        model,
        args.rps,
        args.duration,
        prompt_tokens=pool.workload.mean_prompt_tokens,
        output_tokens=pool.workload.mean_output_tokens,
        seed=args.seed,
        on_progress=progress,
        stats=stats,
    )
    if args.plot is None:
        asyncio.run(load)
    else:
        control_plane = args.control_plane or spec.control_plane.client_url
        asyncio.run(_recorded(load, control_plane, stats, ClientCredential.from_env(Kind.CONTROL_PLANE)))
    if tty:
        print(file=sys.stderr)
    summary = {"gateway": gateway, "model": model, "rps": args.rps, **stats.summary()}
    print(json.dumps(summary, indent=2))
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    if stats.recorder is not None:
        from llmfleet.local.plots import write_timeline_png

        title = f"llmfleet load: stack {loaded.name}, {args.rps:g} req/s for {args.duration:g} s"
        timeline = stats.recorder.timeline(1.0, end_s=stats.since_start())
        print(f"plot: {write_timeline_png(args.plot, timeline, title)}", file=sys.stderr)
    return 0 if stats.sent and not stats.errors else 1
