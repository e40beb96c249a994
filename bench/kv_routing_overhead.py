"""KV routing overhead: the gateway's CPU per request with the ``kv-cache`` scorer (tokenizing each prompt with the
pool's tokenizer and chat template, then walking the KV index) against the same gateway without it, side by side.

    .venv/bin/python bench/kv_routing_overhead.py [--requests N] [--prompt-tokens T] [--concurrency C]

Starts two simulators (almost zero model latency, ``--time-scale 1e6``) that tokenize with the shipped tokenizer
and publish their KV-cache events, and three ``llmfleet gateway`` processes in front of both: ``kv-off`` routes
with p2c over ``queue-depth``; ``kv-on`` adds ``kv-cache`` (its pool names the tokenizer folder, and it subscribes
to both simulators' events); ``kv-work`` routes with ``kv-cache`` under the ``least-work`` picker (no load scorer:
it reads only kv-cache's share, and counts each request's tokens on its replica). All get the same requests: chat
completions of about ``--prompt-tokens`` (2,000) tokens, a long system prompt shared by all and a question of each
request's own, ``max_tokens`` 1, non-streamed, at ``--concurrency`` (8). CPU per request is the gateway
process's user + system time from /proc over the requests it served. Figures are printed, never asserted; the
ratios are the cost of the scorer, and of the picker over p2c.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import KEY, MODEL, Result, _cpu_seconds, _pin, _stack, _start  # noqa: E402
from fleet.tokenizer import load_tokenizer  # noqa: E402

TOKENIZER = "models/llmfleet-tiny-tokenizer"
SYSTEM = "You are the fleet's assistant: answer about engines, batches, queues and caches, briefly and exactly. "


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _messages(i: int, system: str) -> list[dict[str, str]]:
    """The shared ``system`` prompt and a question of request ``i``'s own."""
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: " + "why? " * 40}]


def _gateway_stack(tmp: Path, name: str, kv: bool, picker: str) -> Path:
    document = yaml.safe_load(_stack(tmp).read_text())
    config = document["config"]
    config["llmfleet:environment"] = f"bench-{name}"
    load = [{"name": "queue-depth", "weight": 1}] if picker == "p2c" else []  # least-work reads kv-cache alone
    scorers = load + ([{"name": "kv-cache", "weight": 3}] if kv else [])
    config["llmfleet:gateway"]["routing"] = {"picker": {"name": picker}, "scorers": scorers}
    if kv:
        config["llmfleet:pools"][0]["engine"]["tokenizer"] = str(ROOT / TOKENIZER)
    path = tmp / f"Pulumi.bench-{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def _load(url: str, pid: int, bodies: list[bytes], concurrency: int) -> Result:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors, queue = 0, list(reversed(bodies))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                await resp.read()
                errors += resp.status != 200
            latencies.append(time.perf_counter() - start)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    return Result("chat 2k tokens", "", len(bodies), errors, seconds, latencies, cpu, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            sims, kv_urls = [], []
            for i in range(2):
                kv_port = _port()
                config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{kv_port}"}
                config["topic"] = f"kv@qwen-7b-static-{i}@{MODEL}"
                argv = [sys.executable, "-m", "llmfleet.cli", "sim", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "0"]
                argv += ["--host", "127.0.0.1"]
                argv += ["--served-model-name", MODEL, "--time-scale", "1e6", "--startup-seconds", "0"]
                argv += ["--max-num-seqs", "256", "--tokenizer", str(ROOT / TOKENIZER)]
                argv += ["--kv-events-config", json.dumps(config)]
                proc, url = _start(argv, tmp / f"sim-{i}.log", "API server")
                procs.append(proc)
                sims.append(url)
                kv_urls.append(f"tcp://127.0.0.1:{kv_port}")
            gateways: dict[str, tuple[int, str]] = {}
            variants = (("kv-off", False, "p2c"), ("kv-on", True, "p2c"), ("kv-work", True, "least-work"))
            for core, (name, kv, picker) in enumerate(variants):
                argv = [*_pin(core % (os.cpu_count() or 1)), sys.executable, "-m", "llmfleet.cli", "gateway"]
                argv += ["--stack", str(_gateway_stack(tmp, name, kv, picker)), "--port", "0", "--no-access-log"]
                for url, kv_url in zip(sims, kv_urls, strict=True):
                    argv += ["--replica", url] + (["--kv-events", kv_url] if kv else [])
                proc, url = _start(argv, tmp / f"{name}.log", "listening on")
                procs.append(proc)
                gateways[name] = (proc.pid, url)
            tokenizer = load_tokenizer(ROOT / TOKENIZER)  # a system prompt of about --prompt-tokens - 50 tokens
            system = SYSTEM * max(1, (args.prompt_tokens - 50) // len(tokenizer.encode(SYSTEM)))
            bodies = [
                json.dumps({"model": MODEL, "messages": _messages(i, system), "max_tokens": 1}).encode()
                for i in range(args.requests)
            ]
            tokens = len(tokenizer.chat_ids(_messages(0, system)))
            print(f"prompts of {tokens} tokens (shipped tokenizer), {args.requests} requests, concurrency "
                  f"{args.concurrency}, the same requests through each gateway in turn")  # fmt: skip
            results = {}
            for name, (pid, url) in gateways.items():
                asyncio.run(_load(url, pid, bodies[:20], 4))  # warm connections, caches and the index
                results[name] = asyncio.run(_load(url, pid, bodies, args.concurrency))
            _print(results)
        finally:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGKILL)


def _print(results: dict[str, Result]) -> None:
    print(f"{'gateway':<9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'CPU ms/req':>12}")
    for name, r in results.items():
        cpu = "-" if r.cpu_s is None else f"{r.cpu_s / r.requests * 1000:.2f}"
        print(f"{name:<9}{r.rps:>9.0f}{r.pct(0.5):>9.1f}{r.pct(0.99):>9.1f}{r.errors:>8}{cpu:>12}")
    off, on = results["kv-off"], results["kv-on"]
    if off.cpu_s and on.cpu_s:
        extra = (on.cpu_s / on.requests - off.cpu_s / off.requests) * 1000
        print(f"kv-cache scorer: x{(on.cpu_s / on.requests) / (off.cpu_s / off.requests):.2f} the gateway's CPU "
              f"per request ({extra:+.2f} ms: tokenizing, the index walk, the event feed)")  # fmt: skip
    work = results["kv-work"]
    if on.cpu_s and work.cpu_s:
        per = (work.cpu_s / work.requests - on.cpu_s / on.requests) * 1000
        print(f"least-work over p2c, both with kv-cache: x{(work.cpu_s / work.requests) / (on.cpu_s / on.requests):.2f}"
              f" the gateway's CPU per request ({per:+.2f} ms: no load scorers, the token counts)")  # fmt: skip


if __name__ == "__main__":
    main()
