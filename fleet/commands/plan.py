"""``llmfleet plan --stack NAME``: the capacity plan of every pool, as a table, with warnings in plain words."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from fleet.capacity import PoolPlan, plan_pool
from fleet.commands.registries import all_registries
from fleet.errors import SpecError
from fleet.loader import load_spec

__all__ = ["add_arguments", "render_plan", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml) or a file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_spec(args.stack, registries=all_registries())
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    plans = [plan_pool(loaded.spec, pool) for pool in loaded.spec.pools]
    if args.json:
        print(json.dumps({"stack": loaded.name, "pools": [asdict(p) for p in plans]}, indent=2))
        return 0
    print(f"stack {loaded.name} ({loaded.spec.target}, {', '.join(loaded.spec.availability_zones)})")
    print(render_plan(plans))
    for warning in loaded.warnings:
        print(f"warning: {warning.path}: {warning.message}")
    return 0


def render_plan(plans: list[PoolPlan]) -> str:
    lines: list[str] = []
    total_min = total_peak = 0.0
    for plan in plans:
        total_min += plan.monthly_cost_min_usd
        total_peak += plan.monthly_cost_peak_usd
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
            ("gpus at peak", str(plan.gpus_peak)),
            ("nodes per az at peak", f"{plan.nodes_per_az_peak} x {len(plan.zones)} zones"),
            (
                "monthly cost min/peak",
                f"${plan.monthly_cost_min_usd:,.0f} / ${plan.monthly_cost_peak_usd:,.0f}",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        lines.append(f"\npool {plan.pool}")
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        lines += [f"  note: {n}" for n in plan.notes]
    lines.append(f"\ntotal monthly cost min/peak: ${total_min:,.0f} / ${total_peak:,.0f}")
    return "\n".join(lines)
