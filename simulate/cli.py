"""``llmfleet simulate``: replay a request trace through a stack's pool in virtual time and compare configurations.

    llmfleet simulate --stack prod --trace azure-llm-2023-conv.csv --rate-scale 8 --time-scale 0.25
    llmfleet simulate --stack prod --trace mooncake.jsonl --max-model-len 32768 --compare routing
    llmfleet simulate --stack prod --trace trace.jsonl --compare all --plot replay.png
    llmfleet simulate --stack prod --trace azure-llm-2023-code.csv --rate-scale 4 --compare oracle --frontier
    llmfleet simulate --stack prod --trace mooncake.jsonl --max-model-len 32768 --routing p2c+kv,oracle-kv --fixed 5,8
    llmfleet simulate --stack prod --trace mooncake.jsonl --max-model-len 32768 --tenants 8
    llmfleet simulate --stack prod --trace azure-llm-2023-code.csv --compare pd --pd-threshold 512,2048 --fixed 6

The trace formats are in `simulate.trace`. ``--rate-scale X`` replays X times the requests per second with the
trace's time shape, ``--time-scale Y`` multiplies the timestamps (0.25: an hour in 15 minutes, 4x the rate);
both are printed. ``--compare routing|scaling|all`` runs the routers, the scalers, or every pair of them
(`simulate.configs`) on the same trace and seed; ``seed`` the seed's baseline (``random / threshold``) beside the
stack's own pair, ``oracle`` the oracle scaler beside it; without it the stack's own configuration runs.
``--routing a,b`` names the routers instead (with ``routing``/``all``, or alone: beside the stack's scaler), and
``--fixed SIZES`` runs each of them on fixed pools of those sizes instead of the scalers; with an ``oracle-kv`` row
the table gains ``/oracle`` and the miss split (`simulate.report`). ``--kv-delay-ms`` is how late the replicas'
KV events reach the ``kv-cache`` scorer of ``p2c+kv`` (`simulate.kvfeed`).
``--frontier`` also runs every fixed size (``--sizes`` to choose them) and prints the frontier
(`simulate.frontier`) and where each row sits against it and against the oracle. ``--plot P`` writes the replay over
time to P, with ``--frontier`` the frontier with each scaler's point to P with ``-frontier`` added to its name, and
with ``--fixed`` and several routers the routers side by side at each size (``-routing`` added). ``--week`` replays
the trace once for each day of a week with engines as old as they would be at ``--week-hour`` that day, losing
``--degradation-per-72h`` of their speed per 72 h up, with and without the pool's restart windows (`simulate.week`).
``--tenants N`` splits the trace among N tenants and runs each row twice, with one shared prefix cache and with a
cache per tenant (the gateway's per-tenant ``cache_salt``), and prints what isolation costs (`simulate.tenants`).
``--compare pd`` replays the trace through the aggregated pool and through prefill/decode disaggregated pools of as
many replicas (the plan's count, or each ``--fixed`` size), one per ``--pd-threshold`` (default: a disaggregated
pool's ``thresholdTokens``; its ``prefill.replicas`` bound the split), with TTFT and inter-token latency both in the
SLO (`simulate.pd`; ``--pd-link-gbps`` and ``--pd-handshake-s`` override the node group's EFA
share and the 5 s first contact).
A simulation prints, it never asserts; it exits 2 on a bad trace or option.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fleet.capacity.disagg import DEFAULT_THRESHOLD_TOKENS, HANDSHAKE_S
from fleet.capacity.disagg_plan import pool_link
from fleet.capacity.disagg_split import stack_threshold
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from fleet.spec.stack import FleetSpec
from llmfleet.registries import all_registries
from simulate.configs import ROUTINGS, SCALINGS, Config, stack_config
from simulate.frontier import compare, frontier_configs, frontier_table, parse_sizes, point
from simulate.pd import pd_report
from simulate.replay import BOUND_INTERVAL_S, Prepared, prepare, run_all
from simulate.report import (
    ORACLE_ROUTING,
    Row,
    miss_split,
    oracle_shares,
    row,
    table,
    write_frontier_plot,
    write_plot,
    write_routing_plot,
)
from simulate.tenants import cost_lines, isolated, split
from simulate.trace import TraceError, read_trace, scale_trace, synthetic_trace
from simulate.week import week_report

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
        choices=("routing", "scaling", "all", "seed", "oracle", "pd"),
        default=None,
        help="routers x the stack's scaler, the stack's router x scalers, every pair, random / threshold beside "
        "the stack's pair (seed), the oracle beside it (oracle), or aggregated against prefill/decode "
        "disaggregated pools of as many replicas (pd: simulate/pd.py)",
    )
    parser.add_argument(
        "--frontier", action="store_true", help="also run every fixed size and print the paid-GPU frontier"
    )
    parser.add_argument("--sizes", default=None, help="the frontier's sizes: A..B or a,b,c (default min..max)")
    parser.add_argument(
        "--plot", type=Path, default=None, help="write a PNG of the replay over time (and of the frontier)"
    )
    parser.add_argument("--routing", default=None, help=f"routers to compare, a comma list of {', '.join(ROUTINGS)}")
    parser.add_argument("--fixed", default=None, help="fixed pools of these sizes (A..B or a,b,c) as the scaling")
    parser.add_argument(
        "--kv-delay-ms", type=float, default=50.0, help="KV events reach p2c+kv's index this much later (default 50)"
    )
    parser.add_argument(
        "--week",
        action="store_true",
        help="replay the trace on each day of a week, engines ageing, with and "
        "without the pool's restart windows (simulate/week.py)",
    )
    parser.add_argument("--week-hour", type=float, default=14.0, help="--week: the hour of day replayed (14)")
    parser.add_argument(
        "--degradation-per-72h", type=float, default=0.2, help="--week: speed lost per 72 h of uptime (0.2)"
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=None,
        help="split the trace among N tenants and replay it with a prefix cache per tenant (isolated) and "
        "with one shared cache (simulate/tenants.py)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2, help="configurations simulated in parallel")
    _add_pd_arguments(parser)


def _add_pd_arguments(parser: argparse.ArgumentParser) -> None:
    """``--compare pd``'s options (`simulate.pd`)."""
    parser.add_argument(
        "--pd-threshold",
        default=None,
        help="--compare pd: uncached prompt tokens above which a request prefills remotely, a comma list to sweep "
        f"(default: the pool's disaggregation.thresholdTokens, else {DEFAULT_THRESHOLD_TOKENS})",
    )
    parser.add_argument(
        "--pd-link-gbps", type=float, default=None, help="--compare pd: a prefill replica's Gbit/s (default: its EFA)"
    )
    parser.add_argument(
        "--pd-handshake-s", type=float, default=HANDSHAKE_S, help=f"--compare pd: first contact ({HANDSHAKE_S:g})"
    )


def configs_for(
    compare: str | None, own: Config, routings: Sequence[str] = (), fixed: Sequence[int] = ()
) -> list[Config]:
    """The rows: routers (``routings``, else those ``compare`` picks) x scalings (fixed pools of the ``fixed``
    sizes, size by size, else those ``compare`` picks)."""
    if compare == "pd":  # its rows are `simulate.pd`'s
        return [own]
    if compare in ("seed", "oracle"):
        if routings or fixed:
            raise ValueError(f"--compare {compare} picks its own rows: drop --routing and --fixed, or it")
        if compare == "seed":  # the seed's before: random routing, a threshold scaler
            return [Config("random", "threshold"), own]
        return [own, Config(own.routing, "oracle")]
    unknown = sorted(set(routings) - set(ROUTINGS))
    if unknown:
        raise ValueError(f"--routing {','.join(unknown)}: choose from {', '.join(ROUTINGS)}")
    route = list(routings) or (list(ROUTINGS) if compare in ("routing", "all") else [own.routing])
    if fixed:
        return [Config(r, "fixed", n) for n in fixed for r in route]
    scale = list(SCALINGS) if compare in ("scaling", "all") else [own.scaling]
    return [Config(r, s) for r in route for s in scale]


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
        f"with {max(p.initial_replicas, p.paid_floor)} ready "
        + (
            f"(the paid floor: replicas.fillPaidNodes; the trace's first cold start needs {p.initial_replicas})"
            if p.paid_floor > p.initial_replicas
            else "(what the trace's first cold start needs)"
        )
    )
    lines.append(
        f"yardsticks: clairvoyant bound {p.bound_replica_s / 3600:.2f} replica-hours (peak need "
        f"{max(p.needed, default=0)} over a minute), {p.bound_paid_gpu_s / 3600:.2f} paid GPU-hours at node "
        f"granularity; infinite shared cache hit rate {p.cache_ceiling:.1%}"
    )
    return "\n".join(lines)


def _load(args: argparse.Namespace, own: Config) -> tuple[Prepared, int, list[int], list[Config]]:
    """The prepared replay, the requests before the cut, the frontier's sizes and the rows; raises on a bad
    input."""
    raw_trace = synthetic_trace(40.0, args.seed) if args.trace == "synthetic" else read_trace(args.trace)
    trace = scale_trace(raw_trace, rate_scale=args.rate_scale, time_scale=args.time_scale, seed=args.seed)
    if args.duration is not None:
        trace = [r for r in trace if r.t < args.duration]
    if args.tenants is not None:
        if args.week or args.frontier or args.plot is not None:
            raise ValueError("--tenants compares caches on the rows alone: drop --week, --frontier and --plot")
        trace = split(trace, args.tenants, args.seed, isolated=False)
    prepared = prepare(args.stack, trace, pool_name=args.pool, max_model_len=args.max_model_len)
    sizes = parse_sizes(prepared.pool, args.sizes) if args.frontier else []
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more processes")
    if args.week and not (0.0 <= args.week_hour < 24.0 and 0.0 <= args.degradation_per_72h <= 0.9):
        raise ValueError("--week-hour: give 0 to 24 (not 24); --degradation-per-72h: give 0 to 0.9")
    if args.compare == "pd":
        if args.pd_threshold is not None:
            _thresholds(args.pd_threshold)
        if args.pd_handshake_s < 0 or (args.pd_link_gbps is not None and args.pd_link_gbps <= 0):
            raise ValueError("--pd-handshake-s: give 0 or more; --pd-link-gbps: give a positive rate")
        if args.week or args.frontier or args.tenants is not None or args.routing or args.plot is not None:
            raise ValueError("--compare pd runs its own rows: drop --week, --frontier, --tenants, --routing and --plot")
    if args.kv_delay_ms < 0:
        raise ValueError(f"--kv-delay-ms {args.kv_delay_ms:g}: give 0 or more")
    routings = [r for r in (args.routing or "").split(",") if r]
    fixed = parse_sizes(prepared.pool, args.fixed) if args.fixed is not None else []
    configs = configs_for(args.compare, own, routings, fixed)
    configs = [dataclasses.replace(c, kv_delay_s=args.kv_delay_ms / 1000.0) for c in configs]
    return prepared, len(trace), sizes, configs


def _print_frontier(prepared: Prepared, fixed: list[Row], scalers: list[Row]) -> None:
    print(f"frontier: {len(fixed)} fixed sizes, the stack's router ('*': no cheaper size reaches its share)")
    print(frontier_table(fixed))
    points = [point(r) for r in fixed]
    oracle = next((r for r in scalers if str(r["configuration"]).endswith("/ oracle")), None)
    for r in scalers:
        print("  " + compare(r, points, oracle))
    print(f"  node bound: {prepared.bound_paid_gpu_s / 3600:.2f} paid GPU-hours")


def _extra_plots(args: argparse.Namespace, prepared: Prepared, rows: list[Row], frontier: list[Row]) -> None:
    """The frontier's PNG (with ``--frontier``) and the routers' side by side (``--fixed`` with several)."""
    title = f"{args.stack} / {prepared.pool.name}: {Path(args.trace).name} x{args.rate_scale:g}"
    if frontier:
        path = args.plot.with_name(f"{args.plot.stem}-frontier{args.plot.suffix or '.png'}")
        write_frontier_plot(path, title, frontier, rows)
        print(f"plot: {path}")
    if args.fixed and len({r["routing"] for r in rows}) > 1:
        path = args.plot.with_name(f"{args.plot.stem}-routing{args.plot.suffix or '.png'}")
        write_routing_plot(path, title, rows, prepared.cache_ceiling)
        print(f"plot: {path}")


def _print_tenants(args: argparse.Namespace, shared: Prepared, configs: list[Config]) -> None:
    """The rows on the trace split among ``--tenants``, with one shared cache and with a cache per tenant."""
    apart = isolated(shared, args.tenants, args.seed)
    print(
        f"tenants: {args.tenants}, each request's drawn by a seeded hash of its id (simulate/tenants.py); infinite "
        f"cache hit rate {shared.cache_ceiling:.1%} shared, {apart.cache_ceiling:.1%} isolated"
    )
    rows: dict[str, list[Row]] = {}
    for label, prepared in (("shared", shared), ("isolated", apart)):
        results = run_all(prepared, configs, args.seed, args.jobs)
        named = [{**row(r, prepared), "configuration": f"{r.name} [{label}]"} for r in results]
        rows[label] = oracle_shares(named)
    print(table([*rows["shared"], *rows["isolated"]]))
    print(f"what isolation costs ({args.tenants} tenant{'s' * (args.tenants != 1)}, the same fleet and plan):")
    print("\n".join(cost_lines(rows["shared"], rows["isolated"])))


def _thresholds(text: str) -> list[int]:
    """``--pd-threshold``'s comma list; ValueError naming what is allowed."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise ValueError(f"--pd-threshold {text}: give token counts of 0 or more, comma-separated")
    return values


def _print_pd(args: argparse.Namespace, spec: FleetSpec, prepared: Prepared, own: Config) -> None:
    """``--compare pd``: aggregated against disaggregated at each total size (``--fixed``, else the plan's)."""
    sizes = parse_sizes(prepared.pool, args.fixed) if args.fixed else [prepared.fixed_replicas]
    given = args.pd_threshold
    thresholds = _thresholds(given) if given is not None else [stack_threshold(prepared.pool)]
    link = pool_link(spec, prepared.pool, args.pd_link_gbps, args.pd_handshake_s)
    print(pd_report(prepared, own.routing, [max(2, n) for n in sizes], thresholds, link, args.seed, args.jobs))


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        spec = load_spec(args.stack, registries=all_registries()).spec
        own = stack_config(spec)
        prepared, replayed, sizes, configs = _load(args, own)
    except (TraceError, ValueError, SpecError) as exc:
        print(f"llmfleet simulate: {exc}", file=sys.stderr)
        return 2
    print(_header(args, prepared, replayed), flush=True)
    if args.tenants is not None:
        _print_tenants(args, prepared, configs)
        print(f"wall: {time.perf_counter() - started:.0f}s")
        return 0
    if args.compare == "pd":
        _print_pd(args, spec, prepared, own)
        print(f"wall: {time.perf_counter() - started:.0f}s")
        return 0
    if args.week:
        print(week_report(prepared, own, args.week_hour, args.degradation_per_72h, args.seed, args.jobs))
        print(f"wall: {time.perf_counter() - started:.0f}s")
        return 0
    results = run_all(prepared, [*configs, *frontier_configs(own.routing, sizes)], args.seed, args.jobs)
    rows = [row(r, prepared) for r in results]
    rows[: len(configs)] = oracle_shares(rows[: len(configs)])
    print(table(rows[: len(configs)]))
    split = miss_split(rows[: len(configs)], prepared.cache_ceiling)
    print(
        "xbound: replica-hours / the clairvoyant bound; busy: engine busy time / replica time; paid: engine busy "
        "GPU time / paid GPU time; in-SLO: requests whose TTFT (gateway queue + engine) met "
        "the SLO, rejections count as misses; feasible: the same among requests outside the TTFT floor (their "
        "prefill alone fits the SLO); hit: prompt tokens served from the prefix cache; /ceil: its share "
        "of the infinite shared cache's rate; spread: the busiest replica's busy share over the mean"
        + (f"; /oracle: cached prompt tokens over the {ORACLE_ROUTING} row's of the same scaling" if split else "")
    )
    if split:
        print("miss split (shares of prompt tokens):")
        print("\n".join(split))
    if sizes:
        _print_frontier(prepared, rows[len(configs) :], rows[: len(configs)])
    if args.plot is not None:
        write_plot(args.plot, prepared, results[: len(configs)], spec.autoscaling.interval_s, BOUND_INTERVAL_S)
        print(f"plot: {args.plot}")
        _extra_plots(args, prepared, rows[: len(configs)], rows[len(configs) :])
    print(f"wall: {time.perf_counter() - started:.0f}s")
    return 0
