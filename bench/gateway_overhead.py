"""Gateway overhead: the same load sent direct to one engine and through the gateway, in the same run.

    .venv/bin/python bench/gateway_overhead.py [--requests N] [--quick] [--api chat|responses|messages]
        [--litellm PATH] [--loop auto|asyncio|uvloop] [--plot DIR | --no-plot]

Starts one simulator with (almost) zero model latency (``--time-scale 1e6``) and one ``llmfleet gateway``
process with auth, in-memory quotas and power-of-two-choices routing, each pinned to its own core when the
machine has two or more. The load generator (this process) runs three scenarios against both targets:
non-streaming at concurrency 1 (added latency), non-streaming at concurrency 64 (throughput), and streaming
responses of 256 chunks at concurrency 16 (relay cost), each in the API ``--api`` names (chat completions by
default; OpenAI's Responses, whose ids the gateway rewrites; Anthropic's Messages). CPU per request is the gateway
(or engine) process's user+system time from /proc divided by the requests served. With the ``bench`` extra (or
``--litellm PATH``)
it also runs LiteLLM's proxy against the same engine (offline cost map, master key, no database). It also
measures the CPU that aiohttp and httpx clients spend per request (the reason the gateway proxies with aiohttp).
Figures are printed, never asserted, and drawn into ``gateway-overhead.png`` (``--plot DIR``, default bench/out/):
req/s, p50, p99 and CPU per request, each target side by side within each scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.plotting import add_plot_arguments, pyplot, save  # noqa: E402
from fleet.protocol.keys import hash_api_key  # noqa: E402

MODEL = "qwen2.5-7b-instruct"
# Also LiteLLM's master key, which must look strong for it to start.
KEY = "sk-" + hashlib.sha256(b"llmfleet-bench").hexdigest()
_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


@dataclass
class Result:
    scenario: str
    target: str
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    cpu_s: float | None
    chunks: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _pin(core: int | None) -> list[str]:
    if core is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(core)]


def _start(args: list[str], log: Path, marker: str) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if marker in text and (match := _URL.search(text[text.index(marker) :])):
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{args} did not start:\n{log.read_text(errors='replace')}")


def _stack(tmp: Path) -> Path:
    config = {
        "llmfleet:environment": "bench",
        "llmfleet:target": "local",
        "llmfleet:availabilityZones": ["local-a"],
        "llmfleet:pools": [
            {
                "name": "qwen-7b",
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "servedModelName": MODEL,
                "engine": {"kind": "sim", "maxNumSeqs": 256},
            }
        ],
        "llmfleet:gateway": {
            "replicas": 1,
            "queue": {"perReplicaThreshold": 64, "maxWaiting": 4096, "timeoutS": 30},
            "routing": {"picker": {"name": "p2c"}},
        },
        "llmfleet:tenants": [
            {
                "name": "bench",
                "apiKeyHashes": [hash_api_key(KEY)],
                "requestsPerSecond": 1_000_000,
                "tokensPerMinute": 10**12,
                "maxConcurrency": 100_000,
            }
        ],
    }
    path = tmp / "Pulumi.bench.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def _request(api: str, stream_tokens: int | None) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of one request of ``api``: 8 tokens, or ``stream_tokens`` streamed."""
    tokens = stream_tokens or 8
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    messages = [{"role": "user", "content": "Hi"}]
    body: dict[str, object]
    if api == "responses":
        path, body = "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": tokens}
    elif api == "messages":  # Anthropic's clients send the key as x-api-key
        path, body = "/v1/messages", {"model": MODEL, "messages": messages, "max_tokens": tokens}
        headers = {"x-api-key": KEY, "Content-Type": "application/json"}
    else:
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": tokens}
    if stream_tokens:
        body.update(stream=True, ignore_eos=True)
    return path, json.dumps(body).encode(), headers


async def _run(
    scenario: str,
    target: str,
    url: str,
    pid: int,
    requests: int,
    concurrency: int,
    stream_tokens: int | None,
    api: str = "chat",
) -> Result:
    path, data, headers = _request(api, stream_tokens)
    latencies: list[float] = []
    errors = 0
    chunks = 0
    remaining = requests

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal remaining, errors, chunks
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            try:
                async with session.post(url + path, data=data, headers=headers) as resp:
                    if stream_tokens:
                        async for line in resp.content:
                            if line.startswith(b"data: {"):
                                chunks += 1
                    else:
                        await resp.read()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(min(20, requests)):  # warm connections and code paths
            async with session.post(url + path, data=data, headers=headers) as resp:
                await resp.read()
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    return Result(scenario, target, requests, errors, seconds, latencies, cpu, chunks)


async def _client_cpu(url: str, n: int) -> dict[str, float]:
    """CPU seconds per request this process spends with each HTTP client (same engine, concurrency 16)."""
    import httpx

    data = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    headers = {"Content-Type": "application/json"}
    out: dict[str, float] = {}

    async def timed(name: str, one: Callable[[], Awaitable[None]]) -> None:
        for _ in range(20):
            await one()
        left = n
        start = time.process_time()

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one()

        await asyncio.gather(*(worker() for _ in range(16)))
        out[name] = (time.process_time() - start) / n

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def aio_one() -> None:
            async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as resp:
                await resp.read()

        await timed("aiohttp", aio_one)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:

        async def httpx_one() -> None:
            (await client.post(url + "/v1/chat/completions", content=data, headers=headers)).raise_for_status()

        await timed("httpx", httpx_one)
    return out


def _litellm_binary(given: str | None) -> str | None:
    if given:
        return given
    local = Path(sys.executable).parent / "litellm"
    return str(local) if local.exists() else shutil.which("litellm")


def _litellm(tmp: Path, engine: str, core: int | None, binary: str) -> tuple[subprocess.Popen[bytes], str] | None:
    """LiteLLM's proxy in front of the same engine, offline (local cost map), no auth, no database."""
    params = {"model": f"openai/{MODEL}", "api_base": engine + "/v1", "api_key": "unused"}
    config = {"model_list": [{"model_name": MODEL, "litellm_params": params}]}
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = ["env", "LITELLM_LOCAL_MODEL_COST_MAP=True", "LITELLM_LOG=ERROR", f"LITELLM_MASTER_KEY={KEY}"]
    args = [*env, *_pin(core), binary, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    log = tmp / "litellm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # it logs no "listening" line: poll its health
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=1) as resp:
                if resp.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        print(f"litellm did not start: {log.read_text(errors='replace')[-400:]}", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        return None
    return proc, f"http://127.0.0.1:{port}"


def _print(results: list[Result], clients: dict[str, float]) -> None:
    width = max(26, *(len(r.scenario) + 2 for r in results))
    head = f"{'scenario':<{width}}{'target':<9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'CPU ms/req':>12}"
    head += f"{'chunks/s':>11}{'CPU us/chunk':>14}"
    print(head)
    print("-" * len(head))
    for r in results:
        cpu = r.cpu_s / r.requests * 1000 if r.cpu_s is not None else float("nan")
        cps = r.chunks / r.seconds if r.chunks else 0.0
        per_chunk = r.cpu_s / r.chunks * 1e6 if r.chunks and r.cpu_s is not None else float("nan")
        print(
            f"{r.scenario:<{width}}{r.target:<9}{r.rps:>9.0f}{r.pct(0.5):>9.2f}{r.pct(0.99):>9.2f}{r.errors:>8}"
            f"{cpu:>12.3f}{cps:>11.0f}{per_chunk:>14.1f}"
        )
    print()
    by = {(r.scenario, r.target): r for r in results}
    for scenario in dict.fromkeys(r.scenario for r in results):
        direct, gw = by.get((scenario, "direct")), by.get((scenario, "gateway"))
        if direct is None or gw is None:
            continue
        cpu = (gw.cpu_s or 0.0) / gw.requests * 1000
        line = (
            f"{scenario}: gateway/direct req/s {gw.rps / direct.rps:.2f}x, "
            f"p50 +{gw.pct(0.5) - direct.pct(0.5):.2f} ms, p99 +{gw.pct(0.99) - direct.pct(0.99):.2f} ms, "
            f"gateway CPU {cpu:.3f} ms/req"
        )
        if gw.chunks:
            line += f" ({(gw.cpu_s or 0.0) / gw.chunks * 1e6:.1f} us/chunk)"
        plain = by.get((scenario, "gw-asyncio"))
        if plain is not None:
            line += f"; asyncio loop: {(plain.cpu_s or 0.0) / plain.requests * 1000:.3f} ms/req"
        lite = by.get((scenario, "litellm"))
        if lite is not None:
            line += f"; litellm/gateway req/s {lite.rps / gw.rps:.2f}x"
        print(line)
    if clients:
        print(
            "upstream client CPU per request (this process, concurrency 16): "
            + ", ".join(f"{name} {sec * 1000:.3f} ms" for name, sec in clients.items())
        )


def _apis(text: str) -> str:
    unknown = sorted(set(text.split(",")) - {"chat", "responses", "messages"})
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown API {', '.join(unknown)}: choose from chat, responses, messages")
    return text


def _print_apis(results: list[Result], apis: list[str]) -> None:
    """The gateway's CPU for each API over the first API's, scenario by scenario, all from this run."""
    by = {(r.scenario, r.target): r for r in results if r.target == "gateway"}
    base = apis[0]
    for scenario in dict.fromkeys(r.scenario.rsplit(" [", 1)[0] for r in results):
        first = by[(f"{scenario} [{base}]", "gateway")]
        parts = []
        for api in apis[1:]:
            other = by[(f"{scenario} [{api}]", "gateway")]
            unit = (other.cpu_s or 0.0) / max(1, other.chunks or other.requests)
            unit0 = (first.cpu_s or 0.0) / max(1, first.chunks or first.requests)
            parts.append(f"{api} {unit / unit0:.2f}x")
        per = "chunk" if first.chunks else "request"
        print(f"{scenario}: gateway CPU per {per} over {base}'s: {', '.join(parts)}")


def plot(results: list[Result], directory: Path) -> None:
    """Grouped bars: one group per scenario, one bar per target (direct, gateway, ...), one panel per figure."""
    plt = pyplot()
    scenarios = list(dict.fromkeys(r.scenario for r in results))
    targets = list(dict.fromkeys(r.target for r in results))
    by = {(r.scenario, r.target): r for r in results}
    panels: list[tuple[str, Callable[[Result], float]]] = [
        ("requests / s", lambda r: r.rps),
        ("p50 latency (ms)", lambda r: r.pct(0.5)),
        ("p99 latency (ms)", lambda r: r.pct(0.99)),
        ("CPU per request (ms)", lambda r: r.cpu_s / r.requests * 1000 if r.cpu_s is not None else float("nan")),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    width = 0.8 / len(targets)
    for ax, (label, value) in zip(axes.flat, panels, strict=True):
        for n, target in enumerate(targets):
            xs = [i + (n - (len(targets) - 1) / 2) * width for i in range(len(scenarios))]
            ys = [value(by[(s, target)]) if (s, target) in by else float("nan") for s in scenarios]
            ax.bar(xs, ys, width=width, label=target)
        ax.set_xticks(range(len(scenarios)), scenarios, fontsize=8)
        ax.set_ylabel(label)
        if "latency" in label:  # scenarios differ by orders of magnitude
            ax.set_yscale("log")
        ax.grid(True, axis="y", lw=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("gateway overhead: the same load direct to the engine and through the gateway")
    save(plt, fig, directory, "gateway-overhead.png")


async def main(args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    engine_core, gateway_core = (0, 1) if cores >= 2 else (None, None)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            sim_cmd = [
                *_pin(engine_core),
                sys.executable,
                "-m",
                "llmfleet.cli",
                "sim",
                "serve",
                "Qwen/Qwen2.5-7B-Instruct",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--served-model-name",
                MODEL,
                "--time-scale",
                "1000000",
                "--startup-seconds",
                "0",
                "--max-num-seqs",
                "256",
                "--disable-log-stats",
            ]
            sim, engine = _start(sim_cmd, tmp / "sim.log", "API server")
            procs.append(sim)
            gw_cmd = [
                *_pin(gateway_core),
                sys.executable,
                "-m",
                "llmfleet.cli",
                "gateway",
                "--stack",
                str(_stack(tmp)),
                "--port",
                "0",
                "--replica",
                engine,
                "--no-access-log",
                "--log-level",
                "WARNING",
            ]
            gw, gateway = _start([*gw_cmd, "--loop", args.loop], tmp / "gateway.log", "listening on")
            procs.append(gw)
            targets = [("direct", engine, sim.pid), ("gateway", gateway, gw.pid)]
            if args.loop != "asyncio" and _has_uvloop():  # the same gateway on the standard loop, for comparison
                plain, plain_url = _start([*gw_cmd, "--loop", "asyncio"], tmp / "gateway-asyncio.log", "listening on")
                procs.append(plain)
                targets.append(("gw-asyncio", plain_url, plain.pid))
            binary = _litellm_binary(args.litellm) if not args.quick else None
            lite = _litellm(tmp, engine, gateway_core, binary) if binary else None
            if lite is not None:
                procs.append(lite[0])
                targets.append(("litellm", lite[1], lite[0].pid))
            n = args.requests
            scenarios = [
                ("non-stream c=1", max(200, n // 10), 1, None),
                ("non-stream c=64", n, 64, None),
                ("stream 256 chunks c=16", max(64, n // 20), 16, 256),
            ]
            apis = args.api.split(",")
            results = []
            for name, count, concurrency, tokens in scenarios:
                for api in apis:  # same run, back to back: the APIs side by side within each scenario
                    label = name if len(apis) == 1 else f"{name} [{api}]"
                    for target, url, pid in targets:
                        results.append(await _run(label, target, url, pid, count, concurrency, tokens, api))
            clients = await _client_cpu(engine, max(300, n // 5))
            print(
                f"\ncores: {cores}; engine on core {engine_core}, gateway on core {gateway_core}; "
                f"litellm: {'run' if lite else 'not run' if binary else 'not installed (pip install -e .[bench])'}\n"
            )
            _print(results, clients)
            if len(apis) > 1:
                _print_apis(results, apis)
            if args.plot is not None:
                plot(results, args.plot)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests in the c=64 scenario")
    parser.add_argument("--quick", action="store_true", help="fewer requests, no LiteLLM")
    parser.add_argument(
        "--api",
        default="chat",
        type=_apis,
        help="the APIs each scenario speaks, a comma list of chat (completions), responses (OpenAI's), messages "
        "(Anthropic's); several run side by side in the same run (default chat)",
    )
    parser.add_argument("--litellm", default=None, help="path of a `litellm` binary (default: this venv, PATH)")
    parser.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto", help="the gateway's loop")
    add_plot_arguments(parser)
    ns = parser.parse_args()
    if ns.quick:
        ns.requests = min(ns.requests, 1000)
    asyncio.run(main(ns))
