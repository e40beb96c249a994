"""``llmfleet plan --stack NAME``: the capacity plan of every pool and the GPU capacity it pays for, as tables.

Per pool: memory, per-replica QPS, replicas and how busy they are at peak. Per node group: nodes, paid and used
GPUs, paid-GPU utilisation, node-hours and monthly cost at the pools' min and at peak; under the 70% target,
the options that would raise it. Per pool, whether prefill/decode disaggregation would pay for its declared traffic
at ``--pd-threshold`` (default: the pool's ``disaggregation.thresholdTokens``) and why, or why not, with the figures
(`llmfleet.commands.plan_pd`; ``--json`` carries them under ``disaggregation``). On aws, the fixed monthly charges
(control plane, NAT gateways, endpoints: `fleet.capacity.fixed_costs`), and the totals with them. Prices are the
catalogue's list prices (`fleet.capacity.catalog`), unless the stack sets ``cost.gpuHourUsd``.
Warnings come in plain words.

``--trace T`` prints instead, for each pool, the frontier on that traffic: every fixed fleet size from the pool's
``replicas.min`` to its ``replicas.max`` (``--sizes`` to choose), replayed through `llmfleet simulate`'s
simulator with the stack's router, one row each (paid GPU-hours, busy shares, share of the feasible requests within
the SLO; `simulate.frontier`), so an operator sees what each fleet size buys before publishing an SLO. It exits 2
on a trace that cannot be read or a bad option, saying what is allowed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict

from fleet.capacity.disagg import DEFAULT_THRESHOLD_TOKENS
from fleet.capacity.fixed_costs import fixed_costs
from fleet.capacity.paid import PAID_GPU_UTILISATION_TARGET, GroupPlan, PaidPoint, paid_options, plan_groups
from fleet.capacity.plan import PoolPlan, plan_pool
from fleet.spec.loader import load_or_report
from fleet.spec.stack import FleetSpec
from llmfleet.commands.plan_pd import pd_json, render_pd
from llmfleet.registries import all_registries
from simulate.configs import stack_config
from simulate.frontier import frontier_configs, frontier_table, parse_sizes
from simulate.replay import Prepared, prepare, run_all
from simulate.report import Row, row
from simulate.trace import TraceError, TraceRequest, read_trace, scale_trace

TRACE_FORMATS = "a .csv Azure LLM trace, or a .jsonl Mooncake or llmfleet trace"

__all__ = ["add_arguments", "render_pd", "render_plan", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml) or a file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--pd-threshold",
        type=int,
        default=None,
        help="uncached prompt tokens above which a disaggregated pool would prefill remotely "
        f"(default: the pool's disaggregation.thresholdTokens, else {DEFAULT_THRESHOLD_TOKENS})",
    )
    trace = parser.add_argument_group("the frontier on a trace")
    trace.add_argument("--trace", default=None, help=f"print each pool's frontier on this trace: {TRACE_FORMATS}")
    trace.add_argument("--rate-scale", type=float, default=1.0, help="x requests per second, same time shape")
    trace.add_argument("--time-scale", type=float, default=1.0, help="x timestamps (< 1 compresses the trace)")
    trace.add_argument("--duration", type=float, default=None, help="replay only the first S seconds (scaled)")
    trace.add_argument("--max-model-len", type=int, default=None, help="override the pools' engine maxModelLen")
    trace.add_argument("--sizes", default=None, help="fleet sizes: A..B or a,b,c (default each pool's min..max)")
    trace.add_argument("--seed", type=int, default=7)
    trace.add_argument("--jobs", type=int, default=2, help="fleet sizes simulated in parallel")


def run(args: argparse.Namespace) -> int:
    if args.pd_threshold is not None and args.pd_threshold < 0:
        print(f"llmfleet plan: --pd-threshold {args.pd_threshold}: give 0 or more uncached tokens", file=sys.stderr)
        return 2
    loaded = load_or_report(args.stack, registries=all_registries())
    if loaded is None:
        return 1
    if args.trace is not None:
        return _run_trace(args, loaded.name, loaded.spec)
    plans = [plan_pool(loaded.spec, pool) for pool in loaded.spec.pools]
    groups = plan_groups(loaded.spec, plans)
    today = datetime.date.today()  # which EKS support the control plane's version is in
    if args.json:
        found = {
            **_as_json(loaded.name, loaded.spec, plans, groups, today),
            "disaggregation": pd_json(loaded.spec, args.pd_threshold),
        }
        print(json.dumps(found, indent=2))
        return 0
    print(f"stack {loaded.name} ({loaded.spec.target}, {', '.join(loaded.spec.availability_zones)})")
    print(render_plan(plans, groups, loaded.spec, today))
    print(render_pd(loaded.spec, args.pd_threshold))
    for warning in loaded.warnings:
        print(f"warning: {warning.path}: {warning.message}")
    return 0


def _read(args: argparse.Namespace) -> list[TraceRequest]:
    """The trace as the options scale and cut it; TraceError or ValueError naming what is wrong and allowed."""
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more processes")
    if args.duration is not None and args.duration <= 0:
        raise ValueError(f"--duration {args.duration:g}: give a positive number of seconds")
    try:
        raw = read_trace(args.trace)
    except TraceError as exc:
        raise TraceError(f"{exc} (a trace is {TRACE_FORMATS})") from None
    trace = scale_trace(raw, rate_scale=args.rate_scale, time_scale=args.time_scale, seed=args.seed)
    return [r for r in trace if args.duration is None or r.t < args.duration]


def _trace_header(args: argparse.Namespace, stack: str, prepared: Prepared, routing: str) -> str:
    pool, w = prepared.pool, prepared.pool.workload
    return (
        f"stack {stack}, pool {pool.name}: {args.trace} x{args.rate_scale:g} rate, x{args.time_scale:g} time, "
        f"{len(prepared.trace)} requests ({prepared.too_long} longer than maxModelLen dropped), mean "
        f"{w.mean_prompt_tokens}+{w.mean_output_tokens} tokens, peak {w.peak_qps:.1f} req/s; TTFT SLO "
        f"{pool.slo.ttft_p99_ms:g}ms, {prepared.slo_infeasible} requests under the TTFT floor; node bound "
        f"{prepared.bound_paid_gpu_s / 3600:.2f} paid GPU-hours; router {routing}, seed {args.seed}"
    )


def _run_trace(args: argparse.Namespace, stack: str, spec: FleetSpec) -> int:
    """Each pool's frontier on ``--trace``: one simulated row per fleet size."""
    routing = stack_config(spec).routing
    out: dict[str, list[Row]] = {}
    try:
        trace = _read(args)
        work = []
        for pool in spec.pools:
            prepared = prepare(args.stack, trace, pool_name=pool.name, max_model_len=args.max_model_len)
            work.append((prepared, parse_sizes(prepared.pool, args.sizes)))
    except (TraceError, ValueError) as exc:
        print(f"llmfleet plan: {exc}", file=sys.stderr)
        return 2
    for prepared, sizes in work:
        results = run_all(prepared, frontier_configs(routing, sizes), args.seed, args.jobs)
        rows = out[prepared.pool.name] = [row(r, prepared) for r in results]
        if not args.json:
            print(_trace_header(args, stack, prepared, routing))
            print(frontier_table(rows))
    if args.json:
        print(json.dumps({"stack": stack, "trace": args.trace, "frontier": out}, indent=2))
    return 0


def _point_json(point: PaidPoint) -> dict[str, object]:
    return {
        **asdict(point),
        "nodes": point.nodes,
        "paid_gpus": point.paid_gpus,
        "paid_utilisation": point.paid_utilisation,
        "node_hours_month": point.node_hours_month,
        "monthly_cost_usd": point.monthly_cost_usd,
    }


def _as_json(
    stack: str, spec: FleetSpec, plans: list[PoolPlan], groups: list[GroupPlan], today: datetime.date
) -> dict[str, object]:
    return {
        "stack": stack,
        "pools": [{**asdict(p), "replica_utilisation_peak": _replica_utilisation(p)} for p in plans],
        "node_groups": [
            {
                **{k: v for k, v in asdict(g).items() if k not in ("at_min", "at_peak")},
                "at_min": _point_json(g.at_min),
                "at_peak": _point_json(g.at_peak),
                "options": [asdict(o) for o in paid_options(spec, g)],
            }
            for g in groups
        ],
        "fixed_costs": [asdict(c) for c in fixed_costs(spec, today)],
        "paid_gpu_utilisation_target": PAID_GPU_UTILISATION_TARGET,
    }


def _replica_utilisation(plan: PoolPlan) -> float | None:
    """Peak load / what the peak replicas carry at their SLO (None when a replica carries nothing)."""
    capacity = plan.replicas_peak * plan.per_replica_qps
    return plan.peak_qps / capacity if capacity > 0 else None


def _table(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"\n{title}", *(f"  {k:<{width}}  {v}" for k, v in rows)]


def render_plan(
    plans: list[PoolPlan],
    groups: list[GroupPlan] | None = None,
    spec: FleetSpec | None = None,
    today: datetime.date | None = None,
) -> str:
    """The pools' table, then the node groups' paid capacity (with options when ``spec`` is given), then on aws
    the fixed charges on ``today`` (default: the date now) and the totals with them."""
    lines: list[str] = []
    for plan in plans:
        utilisation = _replica_utilisation(plan)
        rows = [
            ("model", plan.model),
            ("gpu x per replica", f"{plan.gpu} x {plan.gpus_per_replica}"),
            ("weights", f"{plan.weight_gib:.1f} GiB"),
            ("kv per token", f"{plan.kv_bytes_per_token / 1024:.0f} KiB"),
            ("kv cache per replica", f"{plan.kv_budget_gib:.1f} GiB = {plan.kv_tokens:,} tokens"),
            (
                "concurrency per replica",
                f"{plan.concurrency_per_replica} at {plan.mean_context} tokens/request",
            ),
            ("qps per replica", f"{plan.per_replica_qps:.1f} ({plan.qps_source})"),
            ("idle prefill (mean prompt)", f"{plan.idle_prefill_ms:.0f} ms"),
            ("peak qps", f"{plan.peak_qps:g}"),
            (
                "replicas min/needed/peak/max",
                f"{plan.replicas_min} / {plan.replicas_needed} / {plan.replicas_peak} / {plan.replicas_max}",
            ),
            ("gpus used min/peak", f"{plan.replicas_min * plan.gpus_per_replica} / {plan.gpus_peak}"),
            (
                "replica utilisation at peak",
                "n/a"
                if utilisation is None
                else f"{utilisation:.0%} ({plan.peak_qps:g} qps on {plan.replicas_peak} x {plan.per_replica_qps:.1f})",
            ),
        ]
        lines += _table(f"pool {plan.pool}", rows)
        lines += [f"  note: {n}" for n in plan.notes]
    groups = groups if groups is not None else []
    for group in groups:
        lines += _render_group(group, spec)
    total_min = sum(g.at_min.monthly_cost_usd for g in groups)
    total_peak = sum(g.at_peak.monthly_cost_usd for g in groups)
    fixed = fixed_costs(spec, today or datetime.date.today()) if spec is not None else []
    if fixed:
        lines += _table("fixed monthly costs", [(c.item, f"${c.monthly_usd:,.0f} ({c.basis})") for c in fixed])
        base = sum(c.monthly_usd for c in fixed)
        lines.append(f"\ngpu nodes monthly cost min/peak: ${total_min:,.0f} / ${total_peak:,.0f}")
        total_min, total_peak = total_min + base, total_peak + base
    lines.append(f"\ntotal monthly cost min/peak: ${total_min:,.0f} / ${total_peak:,.0f}")
    return "\n".join(lines)


def _render_group(group: GroupPlan, spec: FleetSpec | None) -> list[str]:
    low, peak = group.at_min, group.at_peak
    if group.instance_type is None:
        title = f"gpus of the existing cluster ({group.gpu}, paid by the GPU)"
        head: list[tuple[str, str]] = []
    else:
        title = f"node group {group.group}"
        head = [
            ("instance x zones", f"{group.instance_type} ({group.gpus_per_node} x {group.gpu}) x {len(group.zones)}"),
            ("capacity type", f"{group.capacity_type}, ${peak.gpu_hour_usd:.2f} per GPU-hour"),
            ("nodes per zone min..max", f"{group.min_nodes_per_az} .. {group.max_nodes_per_az}"),
            ("nodes min/peak", f"{low.nodes} ({_zones(low)}) / {peak.nodes} ({_zones(peak)})"),
        ]
    rows = [
        ("pools", ", ".join(group.pools) or "(none)"),
        *head,
        ("paid gpus min/peak", f"{low.paid_gpus} / {peak.paid_gpus}"),
        ("used gpus min/peak", f"{low.used_gpus} / {peak.used_gpus}"),
        (
            "paid-gpu utilisation min/peak",
            f"{low.paid_utilisation:.0%} / {peak.paid_utilisation:.0%} "
            f"(target {PAID_GPU_UTILISATION_TARGET:.0%} at peak)",
        ),
        (
            f"{'node' if group.instance_type else 'gpu'}-hours a month min/peak",
            f"{low.node_hours_month:,.0f} / {peak.node_hours_month:,.0f}",
        ),
        ("monthly cost min/peak", f"${low.monthly_cost_usd:,.0f} / ${peak.monthly_cost_usd:,.0f}"),
    ]
    lines = _table(title, rows)
    lines += [f"  note: {n}" for n in group.notes]
    options = paid_options(spec, group) if spec is not None else []
    if options:
        lines.append(
            f"  paid-gpu utilisation at peak is {peak.paid_utilisation:.0%}, under the "
            f"{PAID_GPU_UTILISATION_TARGET:.0%} target ({peak.idle_gpus} of {peak.paid_gpus} paid GPUs idle). Options:"
        )
        lines += [f"    - {o.text}" for o in options]
    return lines


def _zones(point: PaidPoint) -> str:
    return "+".join(str(n) for n in point.nodes_per_zone)
