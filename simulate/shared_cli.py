"""``llmfleet simulate-shared``: replay one trace into each of a stack's pools on one GPU node group, the pools
sharing the group's GPUs (`simulate.shared`: one awake engine a GPU, the other pools' engines asleep behind it)
against the same pools on groups of their own, and print what each way pays and serves.

    llmfleet simulate-shared --stack prod-two-models \\
        --pool-trace qwen-7b=../shared/traces/azure-llm-2023-code.csv@4 \\
        --pool-trace llama-8b=../shared/traces/azure-llm-2023-conv.csv@8

``--pool-trace POOL=FILE[@RATE]`` (one per pool, at least two) names the trace replayed into the pool and its
``--rate-scale``; ``--duration S`` keeps the first S seconds of each. Both ways run the stack's own router and
scaler with the same seed. A simulation prints, it never asserts; it exits 2 on a bad trace or option.
"""

from __future__ import annotations

import argparse
import sys
import time

from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries
from simulate.configs import stack_config
from simulate.replay import Prepared, prepare
from simulate.report import row
from simulate.shared import WAYS, SharedRun, run_way
from simulate.trace import TraceError, read_trace, scale_trace

__all__ = ["add_arguments", "parse_pool_trace", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="prod-two-models", help="stack name or file (default prod-two-models)")
    parser.add_argument(
        "--pool-trace",
        action="append",
        default=[],
        metavar="POOL=FILE[@RATE]",
        help="a pool, the trace replayed into it and its rate scale (default 1); one per pool, two or more",
    )
    parser.add_argument("--duration", type=float, default=None, help="replay only the first S seconds of each")
    parser.add_argument("--max-model-len", type=int, default=None, help="override the pools' engine maxModelLen")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help=f"comma-separated ways to run, separate first as the baseline (default {','.join(WAYS)})",
    )


def parse_pool_trace(text: str) -> tuple[str, str, float]:
    """``POOL=FILE[@RATE]`` -> (pool, file, rate); ValueError naming the flag and what is allowed."""
    pool, sep, rest = text.partition("=")
    path, _, rate = rest.partition("@")
    try:
        scale = float(rate) if rate else 1.0
    except ValueError:
        scale = -1.0
    if not sep or not pool or not path or scale <= 0:
        raise ValueError(f"--pool-trace {text!r}: give POOL=FILE or POOL=FILE@RATE with a rate above 0")
    return pool, path, scale


def _prepare(args: argparse.Namespace) -> list[Prepared]:
    entries = [parse_pool_trace(t) for t in args.pool_trace]
    if len(entries) < 2 or len({pool for pool, _, _ in entries}) != len(entries):
        raise ValueError("give --pool-trace once for each of two or more pools")
    prepared = []
    for pool, path, rate in entries:
        trace = scale_trace(read_trace(path), rate_scale=rate, seed=args.seed)
        if args.duration is not None:
            trace = [r for r in trace if r.t < args.duration]
        prepared.append(prepare(args.stack, trace, pool_name=pool, max_model_len=args.max_model_len))
    return prepared


def render(runs: list[SharedRun], prepared: list[Prepared]) -> str:
    """One line per pool and way, then each way's bill and the shared one's saving."""
    lines = [f"{'way':<11} {'pool':<10} {'requests':>8} {'feasible':>8} {'in-SLO':>7} {'reject':>6} {'TTFT p99':>9}"]
    for run in runs:
        for result, p in zip(run.results, prepared, strict=True):
            r = row(result, p)
            lines.append(
                f"{run.name:<11} {p.pool.name:<10} {result.requests:>8} {float(r['within_slo_feasible']):>8.2%} "
                f"{float(r['within_slo']):>7.2%} {result.rejected:>6} {float(r['ttft_p99']) * 1000:>7.0f}ms"
            )
    for run in runs:
        wakes = f", {run.wakes} starts were wakes" if run.name == "shared+wake" else ""
        lines.append(
            f"{run.name}: {run.paid_gpu_s / 3600:.2f} paid GPU-hours, {run.node_s / 3600:.2f} node-hours{wakes} "
            f"(wall {run.wall_s:.0f}s)"
        )
    apart = runs[0]
    for shared in runs[1:]:
        if apart.paid_gpu_s > 0:
            saved = 1 - shared.paid_gpu_s / apart.paid_gpu_s
            lines.append(f"{shared.name} pays {saved:.1%} fewer GPU-hours than separate")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        prepared = _prepare(args)
        spec = load_spec(args.stack, registries=all_registries()).spec
        own = stack_config(spec)
        names = ", ".join(f"{p.pool.name} ({len(p.trace)} requests)" for p in prepared)
        print(f"simulate-shared: stack {args.stack}, {own.name}, pools {names}", flush=True)
        ways = [w.strip() for w in args.ways.split(",") if w.strip()]
        if not ways or ways[0] != "separate" or len(set(ways)) != len(ways):
            raise ValueError(f"--ways {args.ways!r}: give separate first, then any of {', '.join(WAYS[1:])}, once each")
        runs = [run_way(spec, prepared, own, args.seed, w) for w in ways]
    except (TraceError, ValueError, SpecError) as exc:
        print(f"llmfleet simulate-shared: {exc}", file=sys.stderr)
        return 2
    print(render(runs, prepared))
    print(f"wall: {time.perf_counter() - started:.0f}s")
    return 0
