"""Bench: the control plane's report intake (``POST /v1/reports``) in reports/s on one core, FastAPI next to aiohttp.

    .venv/bin/python bench/control_plane_intake.py [--seconds S] [--concurrency N] [--replicas N] [--quick]

The requirement: 1,000 replicas each reporting once a second, 1,000 reports/s, served by one control-plane
process. Two servers run in the same run, back to back, each in its own process pinned to one core (the last
one) and served the way ``llmfleet control-plane`` serves its API: the current FastAPI app on uvicorn, and the
previous aiohttp app (``bench/baselines/control_plane_aiohttp.py``) as the baseline. The load generator is this
process, pinned to the other cores: ``--concurrency`` keep-alive connections posting realistic `LoadReport`
bodies from ``--replicas`` distinct replicas as fast as they are answered.

For each server it prints the reports/s achieved, the server's CPU use over the window (user+system time from
/proc) and its capacity on one core: reports per CPU-second. When the server's core is not saturated, the
client is the bottleneck and the capacity is the figure to read. Then the FastAPI/aiohttp ratio, and whether
each clears the requirement. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.protocol.wire import LoadReport  # noqa: E402

REQUIRED = 1_000  # reports/s: 1,000 replicas x 1 report/s
POOL, MODEL = "qwen-7b", "qwen2.5-7b-instruct"  # the local stack's pool
SERVERS = ("aiohttp", "fastapi")
_URL = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
JSON = {"Content-Type": "application/json"}


@dataclass
class Result:
    server: str
    reports: int
    errors: int
    seconds: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.reports / self.seconds

    @property
    def utilisation(self) -> float:
        return self.cpu_s / self.seconds

    @property
    def capacity(self) -> float:
        """Reports per CPU-second of the server: what one saturated core would take."""
        return self.reports / self.cpu_s if self.cpu_s > 0 else float("nan")


def bodies(replicas: int) -> list[bytes]:
    """One report per replica, as an agent would send it (loads vary, every field set)."""
    out = []
    for i in range(replicas):
        name = f"{POOL}-{i:04d}"
        report = LoadReport(
            replica=name,
            pool=POOL,
            engine_url=f"http://10.0.{i // 250}.{i % 250}:8000",
            agent_url=f"http://10.0.{i // 250}.{i % 250}:8001",
            state="ready",
            waiting=float(i % 7),
            running=float(20 + i % 40),
            kv_usage=round(0.2 + (i % 60) / 100, 3),
            ttft_p99_s=round(0.08 + (i % 9) / 100, 3),
            tokens_per_s=1800.0 + i % 500,
            model=MODEL,
            engine_version="vllm-0.33.0",
            uptime_s=3600.0 + i,
            restarts=i % 3,
            ts=1_790_000_000.0 + i / 1000,
        )
        out.append(report.model_dump_json().encode())
    return out


# ---- the server side (a child process: --serve NAME) -----------------------------------------------------


async def serve(name: str) -> None:
    from control_plane.plane import ControlPlane
    from fleet.protocol.clock import SystemClock
    from fleet.protocol.control_api import ApiServer, bind
    from fleet.spec.loader import load_spec

    cp = ControlPlane.build(load_spec("local").spec, SystemClock())
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    if name == "fastapi":
        from control_plane.api.app import create_app

        server = ApiServer(create_app(cp), sock)
        await server.start()
        print(f"listening on http://127.0.0.1:{port}", flush=True)
        await stop.wait()
        await server.stop()
    else:
        from aiohttp import web

        sys.path.insert(0, str(ROOT / "bench"))
        from baselines.control_plane_aiohttp import create_app as create_aiohttp_app

        runner = web.AppRunner(create_aiohttp_app(cp), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        print(f"listening on http://127.0.0.1:{port}", flush=True)
        await stop.wait()
        await runner.cleanup()


# ---- the load side (this process) -------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(name: str, core: int | None, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    argv = [sys.executable, __file__, "--serve", name]
    if core is not None:
        argv += ["--core", str(core)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if match := _URL.search(log.read_text(errors="replace")):
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} server did not start:\n{log.read_text(errors='replace')}")


async def _post_for(
    session: aiohttp.ClientSession, url: str, payloads: list[bytes], concurrency: int, seconds: float
) -> tuple[int, int]:
    ok = errors = 0
    until = time.monotonic() + seconds

    async def worker(first: int) -> None:
        nonlocal ok, errors
        i = first
        while time.monotonic() < until:
            async with session.post(url, data=payloads[i % len(payloads)], headers=JSON) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                else:
                    errors += 1
            i += concurrency

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return ok, errors


async def measure(name: str, url: str, pid: int, payloads: list[bytes], args: argparse.Namespace) -> Result:
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _post_for(session, url + "/v1/reports", payloads, args.concurrency, args.warmup)
        cpu0, t0 = _cpu_seconds(pid), time.monotonic()
        ok, errors = await _post_for(session, url + "/v1/reports", payloads, args.concurrency, args.seconds)
        seconds, cpu = time.monotonic() - t0, _cpu_seconds(pid) - cpu0
    return Result(name, ok, errors, seconds, cpu)


def report(results: list[Result], cores: int, server_core: int | None, args: argparse.Namespace) -> None:
    print(
        f"\ncores: {cores}; servers on core {server_core}, load generator on the others; {args.concurrency} "
        f"connections, {args.replicas} replicas, {args.seconds:.0f} s per server after {args.warmup:.0f} s warm-up\n"
    )
    head = f"{'server':<10}{'reports/s':>11}{'errors':>8}{'server CPU':>12}{'reports/CPU-s':>15}{'clears 1,000/s':>16}"
    print(head)
    print("-" * len(head))
    for r in results:
        saturated = r.utilisation >= 0.9
        clears = (r.rate if saturated else r.capacity) >= REQUIRED
        print(
            f"{r.server:<10}{r.rate:>11,.0f}{r.errors:>8}{r.utilisation:>11.0%} {r.capacity:>15,.0f}"
            f"{'yes' if clears else 'NO':>16}"
        )
    by = {r.server: r for r in results}
    fast, base = by.get("fastapi"), by.get("aiohttp")
    if fast and base:
        print(
            f"\nfastapi/aiohttp: reports/s {fast.rate / base.rate:.2f}x, reports per CPU-second "
            f"{fast.capacity / base.capacity:.2f}x; CPU per report {1000 / fast.capacity:.3f} ms (fastapi) vs "
            f"{1000 / base.capacity:.3f} ms (aiohttp)"
        )
    print(
        f"requirement: {REQUIRED:,} replicas x 1 report/s = {REQUIRED:,} reports/s on one core; "
        "a server under 90% CPU was client-bound, so its reports/CPU-s is its one-core capacity"
    )


async def main(args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    server_core = cores - 1 if cores >= 2 else None
    if server_core is not None:
        os.sched_setaffinity(0, set(range(cores)) - {server_core})
    payloads = bodies(args.replicas)
    results = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in SERVERS:  # same run, back to back
            proc, url = _start(name, server_core, Path(tmpdir) / f"{name}.log")
            try:
                results.append(await measure(name, url, proc.pid, payloads, args))
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    report(results, cores, server_core, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per server")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window")
    parser.add_argument("--concurrency", type=int, default=64, help="client connections")
    parser.add_argument("--replicas", type=int, default=1000, help="distinct replicas reporting")
    parser.add_argument("--quick", action="store_true", help="3 s per server")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.serve:
        if ns.core is not None:
            os.sched_setaffinity(0, {ns.core})
        asyncio.run(serve(ns.serve))
    else:
        if ns.quick:
            ns.seconds, ns.warmup = 3.0, 1.0
        asyncio.run(main(ns))
