"""Soak: a local fleet under steady load for a long time, and what each process holds at the start and the end.

    .venv/bin/python bench/soak.py [--duration 3600] [--rps 4] [--sample-s 60] [--kv-blocks 2048] [--keep-logs]

Starts the fleet as `bench/chaos.py` does (`chaos_harness.Fleet`: the control plane with the local actuator, its
agents and their simulated engines, one gateway, real processes on loopback), sends Poisson streamed chat
completions (`chaos_load.Load`, every answer checked word for word) for ``--duration`` seconds after a warm-up,
and samples every process of the fleet each ``--sample-s``: resident memory (``VmRSS``), open file descriptors,
and of those the sockets, read from ``/proc``. Printed: one row per process with its figures at the first sample
after the warm-up, at the end, and their largest value between; then the requests by outcome. A process that was
replaced meanwhile (a new pid for the same role) is a row of its own. Then each process's resident memory at every
tenth of the run, and its growth over the first half and over the second: a cache that fills grows in the first
half, a leak in both.

``--kv-blocks N`` holds each engine's KV cache to N blocks (``--num-gpu-blocks-override``, as vLLM's), so the
caches that follow it fill within minutes: the engine's prefix cache, and the gateway's KV index of every engine's
blocks (``kv-cache`` routing). At the simulated A100's own 64,746 blocks an engine takes about an hour of this
load to fill, and both processes grow for that hour by design; 0 keeps the engine's own size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_harness import Fleet, marked_pids, sweep  # noqa: E402
from bench.chaos_load import Load  # noqa: E402
from fleet.protocol.keys import DEMO_API_KEY  # noqa: E402

MODEL = "qwen2.5-7b-instruct"
WARM_UP_S = 30.0


@dataclass
class Track:
    """One process's samples: (resident MiB, open fds, sockets)."""

    pid: int
    role: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)


def _role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    for role in ("control-plane", "gateway", "agent", "serve", "redis-server"):
        if any(w == role or w.endswith("/" + role) for w in words):
            return "engine (sim)" if role == "serve" else role
    return Path(words[0]).name if words else "?"


def sample(pid: int) -> tuple[float, int, int] | None:
    """(VmRSS in MiB, open fds, sockets among them) of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return rss_kib / 1024.0, len(fds), sockets


def sample_all(marker: str, tracks: dict[int, Track]) -> None:
    for pid in marked_pids(marker):
        figures = sample(pid)
        if figures is None:
            continue
        track = tracks.setdefault(pid, Track(pid, _role(pid)))
        track.samples.append(figures)


def table(tracks: dict[int, Track]) -> str:
    head = (
        f"{'process':<16} {'pid':>7} {'samples':>7} {'RSS MiB first':>13} {'last':>7} {'max':>7} "
        f"{'fds first':>9} {'last':>5} {'max':>5} {'sockets first':>13} {'last':>5} {'max':>5}"
    )
    lines = [head]
    for t in sorted(tracks.values(), key=lambda t: (t.role, t.pid)):
        (r0, f0, s0), (r1, f1, s1) = t.samples[0], t.samples[-1]
        lines.append(
            f"{t.role:<16} {t.pid:>7} {len(t.samples):>7} {r0:>13.1f} {r1:>7.1f} {max(s[0] for s in t.samples):>7.1f} "
            f"{f0:>9} {f1:>5} {max(s[1] for s in t.samples):>5} {s0:>13} {s1:>5} {max(s[2] for s in t.samples):>5}"
        )
    return "\n".join(lines)


def series(tracks: dict[int, Track]) -> str:
    """Resident MiB of each process at every tenth of its samples, and its growth over each half."""
    lines = []
    for t in sorted(tracks.values(), key=lambda t: (t.role, t.pid)):
        rss = [s[0] for s in t.samples]
        tenths = [rss[min(len(rss) - 1, round(i * (len(rss) - 1) / 10))] for i in range(11)]
        half = rss[(len(rss) - 1) // 2]
        lines.append(
            f"{t.role:<16} {t.pid:>7}  " + " ".join(f"{r:6.1f}" for r in tenths)
            + f"   first half {half - rss[0]:+6.1f}, second half {rss[-1] - half:+6.1f}"
        )  # fmt: skip
    return "resident MiB at every tenth of the run:\n" + "\n".join(lines)


async def soak(args: argparse.Namespace, folder: Path) -> None:
    marker = f"soak-{os.getpid()}-{time.time_ns()}"
    blocks = ["--num-gpu-blocks-override", str(args.kv_blocks)] if args.kv_blocks else []
    fleet = Fleet(folder, marker, {"pools": [{"engine": {"extraArgs": blocks}}]} if blocks else {})
    try:
        await fleet.start()
        load = Load(
            fleet.gateways[0].url, DEMO_API_KEY, MODEL, args.rps, seed=args.seed, tokenizer=fleet.engine_tokenizer()
        )
        load_task = asyncio.create_task(load.run())
        await asyncio.sleep(WARM_UP_S)  # the fleet's start-up allocations are not what is measured
        tracks: dict[int, Track] = {}
        started = time.monotonic()
        while True:
            sample_all(marker, tracks)
            left = args.duration - (time.monotonic() - started)
            if left <= 0:
                break
            await asyncio.sleep(min(args.sample_s, left))
        load.stop()
        await asyncio.wait_for(load_task, timeout=120)
        sample_all(marker, tracks)
        minutes = (time.monotonic() - started) / 60.0
        print(
            f"soak: {minutes:.1f} min at {args.rps:g} req/s (after {WARM_UP_S:g} s of warm-up), "
            f"sampled every {args.sample_s:g} s; engines' KV cache: "
            + (f"{args.kv_blocks} blocks" if args.kv_blocks else "their own size")
        )
        print(table(tracks))
        print(series(tracks))
        counts = load.counts()
        kinds: dict[str, int] = {}
        for o in load.outcomes:
            if o.verdict != "completed":
                kinds[o.kind] = kinds.get(o.kind, 0) + 1
        print(
            f"requests: {len(load.outcomes)} sent, {counts['completed']} completed, {counts['error']} clear errors, "
            f"{counts['truncated']} silent truncations" + (f"; {kinds}" if kinds else "")
        )
    finally:
        await fleet.close()
        sweep(marker)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of load after the warm-up")
    parser.add_argument("--rps", type=float, default=4.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kv-blocks", type=int, default=2048, help="each engine's KV blocks (0: its own size)")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="llmfleet-soak-"))
    try:
        asyncio.run(soak(args, folder))
    finally:
        if args.keep_logs:
            print(f"logs: {folder / 'logs'}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
