"""Bench: the engine simulator against its calibration targets, in virtual time and over real HTTP.

    .venv/bin/python bench/engine_sim.py [--quick] [--time-scale X] [--rounds N] [--plot DIR | --no-plot]

Prints three tables:
1. calibration (virtual time, Qwen2.5-7B on a simulated A100-80GB): full-batch decode tok/s at batch 1, 32
   and 256 (~1k-token contexts) and an idle 512-token prefill, each next to its target and the % error;
2. a closed-loop sweep over concurrency 1, 8, 32, 128, 256 with a fixed 512-in / 256-out token mix, in
   virtual time and then through a real `python -m engine_sim` process over HTTP (client-side timings,
   converted to model seconds), side by side;
3. how many concurrent streams one simulator process sustains in real time on this machine: the largest
   concurrency whose HTTP throughput stays within 10% of the virtual-time figure while the engine loop
   drops less than 5% of model time (``llmfleet_sim_behind_seconds_total``).

The sweep is also drawn into ``engine-sim.png`` (``--plot DIR``, default bench/out/): tok/s, TTFT and ITL
p50/p99 against concurrency, virtual time and HTTP side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plotting import add_plot_arguments, pyplot, save  # noqa: E402
from engine_sim.config import EngineConfig, build_scheduler  # noqa: E402
from engine_sim.request import SimRequest  # noqa: E402
from fleet.capacity.catalog import MODELS  # noqa: E402
from fleet.protocol import promtext  # noqa: E402
from fleet.protocol.ports import free_port

MODEL = "Qwen/Qwen2.5-7B-Instruct"
PROMPT, OUTPUT = 512, 256
CONCURRENCY = (1, 8, 32, 128, 256)


def _config(**kw: object) -> EngineConfig:
    return EngineConfig(model=MODEL, facts=MODELS[MODEL], served_model_name="qwen", **kw)  # type: ignore[arg-type]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- calibration --------------------------------------------------------------------------------------------
def decode_tokens_per_s(batch: int) -> float:
    """Engine output tok/s over full-batch decode steps; 768-token prompts + 512 outputs (~1k context)."""
    sched = build_scheduler(_config())
    for i in range(batch):
        sched.add(SimRequest(f"r{i}", [i * 100_000 + j for j in range(768)], 512), 0.0)
    now, tokens, seconds = 0.0, 0, 0.0
    while (result := sched.step(now)) is not None:
        now = result.plan.end
        if result.plan.work.prefill_attention_tokens2 == 0 and len(result.plan.scheduled) == batch:
            tokens += len(result.events)
            seconds += result.plan.duration
    return tokens / seconds


def idle_prefill_ms(prompt: int = 512) -> float:
    sched = build_scheduler(_config())
    request = SimRequest("p", list(range(prompt)), 1)
    sched.add(request, 0.0)
    while sched.step(0.0) is not None:
        pass
    assert request.first_token_time is not None
    return request.first_token_time * 1000


def print_calibration() -> None:
    rows = [
        ("batch-1 decode (tok/s)", 85.0, decode_tokens_per_s(1)),
        ("batch-32 decode (tok/s)", 2500.0, decode_tokens_per_s(32)),
        ("batch-256 decode (tok/s)", 8000.0, decode_tokens_per_s(256)),
        ("idle 512-token prefill (ms)", 40.0, idle_prefill_ms()),
    ]
    print("Calibration: Qwen2.5-7B, simulated A100-80GB, virtual time")
    print(f"{'quantity':<30}{'target':>10}{'simulated':>12}{'error':>9}")
    for name, target, value in rows:
        err = (value - target) / target * 100
        flag = "" if abs(err) <= 10 else "  OUT OF +-10%"
        print(f"{name:<30}{target:>10.1f}{value:>12.1f}{err:>+8.1f}%{flag}")
    print()


# -- closed loop --------------------------------------------------------------------------------------------
@dataclass
class SweepRow:
    concurrency: int
    tok_s: float
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    kv_peak: float = 0.0
    preemptions: int = 0
    behind_s: float = 0.0
    duration_s: float = 0.0


def virtual_sweep(concurrency: int, rounds: int) -> SweepRow:
    """Closed loop in virtual time: each client sends its next request when the previous one finishes."""
    sched = build_scheduler(_config())
    ids = iter(range(10**9))
    remaining = {c: rounds for c in range(concurrency)}
    owner: dict[str, int] = {}

    def send(client: int, now: float) -> None:
        rid = f"c{client}-{next(ids)}"
        base = int(rid.split("-")[1]) * 1_000_000
        owner[rid] = client
        remaining[client] -= 1
        sched.add(SimRequest(rid, list(range(base, base + PROMPT)), OUTPUT), now)

    for client in range(concurrency):
        send(client, 0.0)
    row = SweepRow(concurrency, 0.0)
    now, tokens = 0.0, 0
    while (result := sched.step(now)) is not None:
        now = result.plan.end
        row.kv_peak = max(row.kv_peak, sched.kv_usage)
        for event in result.events:
            tokens += 1
            (row.ttft if event.first else row.itl).append(event.latency)
            if event.finished is not None:
                client = owner.pop(event.request.request_id)
                if remaining[client] > 0:
                    send(client, now)
    row.tok_s, row.preemptions, row.duration_s = tokens / now, sched.stats.preemptions, now
    return row


async def _wait_healthy(session: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{base}/health") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("simulator did not become healthy")


async def _scrape(session: aiohttp.ClientSession, base: str) -> dict[str, list[promtext.Sample]]:
    async with session.get(f"{base}/metrics") as response:
        return promtext.parse(await response.text())


async def http_sweep(concurrency: int, rounds: int, time_scale: float) -> SweepRow:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "engine_sim", "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--served-model-name", "qwen", "--startup-seconds", "0", "--time-scale", str(time_scale)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    row = SweepRow(concurrency, 0.0)
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
            await _wait_healthy(session, base)
            tokens = 0
            counter = iter(range(10**9))

            async def client() -> None:
                nonlocal tokens
                for _ in range(rounds):
                    start = next(counter) * 1_000_000
                    body = {"model": "qwen", "prompt": list(range(start, start + PROMPT)), "max_tokens": OUTPUT}
                    body |= {"stream": True, "ignore_eos": True}
                    sent = last = time.monotonic()
                    first = True
                    async with session.post(f"{base}/v1/completions", json=body) as response:
                        async for raw in response.content:
                            if not raw.startswith(b"data: {"):
                                continue
                            now = time.monotonic()
                            (row.ttft if first else row.itl).append((now - (sent if first else last)) * time_scale)
                            first, last = False, now
                            tokens += 1

            async def watch_kv() -> None:
                while True:
                    samples = await _scrape(session, base)
                    row.kv_peak = max(row.kv_peak, promtext.gauge_value(samples, "vllm:kv_cache_usage_perc"))
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch_kv())
            t0 = time.monotonic()
            await asyncio.gather(*(client() for _ in range(concurrency)))
            wall = time.monotonic() - t0
            watcher.cancel()
            samples = await _scrape(session, base)
            row.tok_s = tokens / (wall * time_scale)
            row.preemptions = int(promtext.counter_value(samples, "vllm:num_preemptions"))
            row.behind_s = promtext.counter_value(samples, "llmfleet_sim_behind_seconds")
            row.duration_s = wall * time_scale
    finally:
        proc.terminate()
        proc.wait(10)
    return row


def _fmt(row: SweepRow) -> str:
    ms = 1000.0
    return (
        f"{row.tok_s:>8.0f} {_pct(row.ttft, 0.5) * ms:>7.0f} {_pct(row.ttft, 0.99) * ms:>7.0f} "
        f"{_pct(row.itl, 0.5) * ms:>6.1f} {_pct(row.itl, 0.99) * ms:>6.1f} {row.kv_peak:>5.2f} {row.preemptions:>5d}"
    )


def plot(rows: list[tuple[SweepRow, SweepRow]], directory: Path) -> None:
    """tok/s, TTFT and ITL against concurrency: virtual time solid, HTTP dashed."""
    plt = pyplot()
    fig, (tok, ttft, itl) = plt.subplots(1, 3, figsize=(13, 4))
    levels = [virtual.concurrency for virtual, _ in rows]
    for n, run in enumerate(("virtual", "HTTP")):
        style = "-" if n == 0 else "--"
        picked = [pair[n] for pair in rows]
        tok.plot(levels, [r.tok_s for r in picked], style, marker="o", label=run)
        for ax, series in ((ttft, "ttft"), (itl, "itl")):
            for q in (0.5, 0.99):
                values = [_pct(getattr(r, series), q) * 1000 for r in picked]
                ax.plot(levels, values, style, marker=".", label=f"{run} p{q * 100:g}")
    for ax, label in ((tok, "output tok/s"), (ttft, "TTFT (ms, model time)"), (itl, "ITL (ms, model time)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, lw=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"engine simulator: closed loop, {PROMPT}-token prompts, {OUTPUT} output tokens")
    save(plt, fig, directory, "engine-sim.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round per client, concurrency up to 128")
    parser.add_argument("--time-scale", type=float, default=1.0, help="model clock speed-up of the HTTP runs")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client in each run")
    add_plot_arguments(parser)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    levels = CONCURRENCY[:-1] if args.quick else CONCURRENCY

    print_calibration()
    print(f"Closed loop, {PROMPT}-token prompts, {OUTPUT} output tokens, {rounds} request(s) per client")
    print(f"HTTP runs: one `python -m engine_sim` process, time scale {args.time_scale:g}, client on this host")
    head = f"{'tok/s':>8} {'TTFT50':>7} {'TTFT99':>7} {'ITL50':>6} {'ITL99':>6} {'KVpk':>5} {'preem':>5}"
    print(f"{'conc':>5} | {'virtual':^54} | {'HTTP (model seconds)':^54} | {'HTTP/virt':>9} {'behind':>7} {'real':>5}")
    print(f"{'':>5} | {head} | {head} | {'tok/s':>9} {'%time':>7} {'time':>5}")
    sustained, largest, failed = 0, 0, False
    rows: list[tuple[SweepRow, SweepRow]] = []
    for level in levels:
        virtual = virtual_sweep(level, rounds)
        real = asyncio.run(http_sweep(level, rounds, args.time_scale))
        rows.append((virtual, real))
        ratio = real.tok_s / virtual.tok_s
        behind = real.behind_s / real.duration_s * 100 if real.duration_s else 0.0
        ok = ratio >= 0.9 and behind < 5.0
        verdict = "yes" if ok else "NO"
        print(f"{level:>5} | {_fmt(virtual)} | {_fmt(real)} | {ratio:>9.2f} {behind:>6.1f}% {verdict:>5}", flush=True)
        failed = failed or not ok
        largest = level if ok else largest
        sustained = level if ok and not failed else sustained
    print()
    print(
        f"One simulator process sustains {sustained} concurrent streams in real time on this machine "
        f"({os.cpu_count()} CPUs; every level up to it kept HTTP tok/s >= 90% of virtual with < 5% of model "
        f"time dropped; largest passing level: {largest}). The client runs on the same host."
    )
    print("latencies in ms of model time; KVpk = peak KV usage; preem = preemptions")
    if args.plot is not None:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
