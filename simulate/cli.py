"""``llmfleet simulate``: replay a request trace through a stack's pool in virtual time and compare configurations.

    llmfleet simulate --stack prod --trace azure-llm-2023-conv.csv --rate-scale 8 --time-scale 0.25
    llmfleet simulate --stack prod --trace mooncake.jsonl --max-model-len 32768 --compare routing
    llmfleet simulate --stack prod --trace trace.jsonl --compare all --plot replay.png

The trace formats are in `simulate.trace`. ``--rate-scale X`` replays X times the requests per second with the
trace's time shape, ``--time-scale Y`` multiplies the timestamps (0.25: an hour in 15 minutes, 4x the rate);
both are printed. ``--compare routing|scaling|all`` runs the routers, the scalers, or every pair of them
(`simulate.configs`) on the same trace and seed; without it the stack's own configuration runs. A simulation
prints, it never asserts; it exits 2 on a bad trace or option.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries
from simulate.configs import ROUTINGS, SCALINGS, Config, stack_config
from simulate.replay import BOUND_INTERVAL_S, Prepared, prepare, run_config
from simulate.report import row, table, write_plot
from simulate.trace import TraceError, read_trace, scale_trace, synthetic_trace

__all__ = ["add_arguments", "configs_for", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="prod", help="stack name or file (default prod)")
    parser.add_argument("--pool", default=None, help="the pool to replay into (default: the stack's first)")
    parser.add_argument(
        "--trace", required=True, help="trace file (.csv: Azure; .jsonl: Mooncake or llmfleet), or 'synthetic'"
    )
    parser.add_argument("--rate-scale", type=float, default=1.0, help="x requests per second, same time shape")
    parser.add_argument("--time-scale", type=float, default=1.0, help="x timestamps (< 1 compresses the trace)")
    parser.add_argument("--duration", type=float, default=None, help="replay only the first S seconds (scaled)")
    parser.add_argument("--max-model-len", type=int, default=None, help="override the pool's engine maxModelLen")
    parser.add_argument(
        "--compare",
        choices=("routing", "scaling", "all"),
        default=None,
        help="routers x the stack's scaler, the stack's router x scalers, or every pair",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the replay over time")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2, help="configurations simulated in parallel")


def configs_for(compare: str | None, own: Config) -> list[Config]:
    if compare == "routing":
        return [Config(r, own.scaling) for r in ROUTINGS]
    if compare == "scaling":
        return [Config(own.routing, s) for s in SCALINGS]
    if compare == "all":
        return [Config(r, s) for r in ROUTINGS for s in SCALINGS]
    return [own]


def _header(args: argparse.Namespace, p: Prepared, raw: int) -> str:
    pool, plan = p.pool, p.plan
    w = pool.workload
    span = p.trace[-1].t if p.trace else 0.0
    lines = [
        f"simulate: stack {args.stack}, pool {pool.name} ({pool.model} on {plan.gpu}), replicas "
        f"{pool.replicas.min}..{pool.replicas.max}, cold start {pool.cold_start_seconds:g}s, TTFT SLO "
        f"{pool.slo.ttft_p99_ms:g}ms, maxModelLen {pool.engine.max_model_len}",
        f"trace: {args.trace}, {raw} requests, rate x{args.rate_scale:g}, time x{args.time_scale:g}"
        + (f", first {args.duration:g}s" if args.duration is not None else "")
        + f": {len(p.trace)} replayed over {span:.0f}s, mean {w.mean_prompt_tokens}+{w.mean_output_tokens} "
        f"tokens, peak {w.peak_qps:.1f} req/s (busiest minute), seed {args.seed}",
    ]
    if p.too_long:
        lines.append(
            f"dropped: {p.too_long} requests ({p.too_long / raw:.1%}) longer than maxModelLen "
            f"{pool.engine.max_model_len} (prompt + output), as vLLM refuses them"
        )
    if p.slo_infeasible:
        lines.append(
            f"TTFT floor: {p.slo_infeasible} requests ({p.slo_infeasible / len(p.trace):.2%}) cannot meet the "
            f"{pool.slo.ttft_p99_ms:g}ms TTFT SLO alone on an idle replica without a prefix-cache hit "
            "(their prefill takes longer)"
        )
    lines.append(
        f"plan for this trace: {plan.per_replica_qps:.2f} req/s per replica at the SLO, {plan.replicas_needed} "
        f"needed at peak (buffer {w.capacity_buffer:g}); 'fixed' runs {p.fixed_replicas}, scalers start "
        f"with {p.initial_replicas} ready (what the trace's first cold start needs)"
    )
    lines.append(
        f"yardsticks: clairvoyant bound {p.bound_replica_s / 3600:.2f} replica-hours (peak need "
        f"{max(p.needed, default=0)} over a minute); infinite shared cache hit rate {p.cache_ceiling:.1%}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        if args.trace == "synthetic":
            raw_trace = synthetic_trace(40.0, args.seed)
        else:
            raw_trace = read_trace(args.trace)
        trace = scale_trace(raw_trace, rate_scale=args.rate_scale, time_scale=args.time_scale, seed=args.seed)
        if args.duration is not None:
            trace = [r for r in trace if r.t < args.duration]
        prepared = prepare(args.stack, trace, pool_name=args.pool, max_model_len=args.max_model_len)
    except (TraceError, ValueError, SpecError) as exc:
        print(f"llmfleet simulate: {exc}", file=sys.stderr)
        return 2
    spec = load_spec(args.stack, registries=all_registries()).spec
    print(_header(args, prepared, len(trace)), flush=True)
    configs = configs_for(args.compare, stack_config(spec))
    jobs = max(1, min(args.jobs, len(configs)))
    if jobs == 1:
        results = [run_config(prepared, c, args.seed) for c in configs]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(run_config, [prepared] * len(configs), configs, [args.seed] * len(configs)))
    print(table([row(r, prepared) for r in results]))
    print(
        "xbound: replica-hours / the clairvoyant bound; in-SLO: requests whose TTFT (gateway queue + engine) met "
        "the SLO, rejections count as misses; feasible: the same among requests outside the TTFT floor (their "
        "prefill alone fits the SLO); hit: prompt tokens served from the prefix cache; /ceil: its share "
        "of the infinite shared cache's rate"
    )
    if args.plot is not None:
        write_plot(args.plot, prepared, results, spec.autoscaling.interval_s, BOUND_INTERVAL_S)
        print(f"plot: {args.plot}")
    print(f"wall: {time.perf_counter() - started:.0f}s")
    return 0
