"""SLO: ``llmfleet slo --stack NAME [--prometheus URL] [--json]``: each pool's error budget per SLO.

Without ``--prometheus`` the stack's control plane answers (``GET /v1/pools/{pool}/budget``, counted from what the
gateways served since it started, or from the Prometheus it was started with). With it, the budgets are computed
here from that Prometheus (the ``prometheus`` budget source of `control_plane.budget.sources`). Either way the
arithmetic is `fleet.slo.budget`'s, and planned restart windows are left out of the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from typing import Any

import httpx

from fleet.protocol.control_auth import operator_auth
from fleet.protocol.wire import PoolBudget, SloBudget
from fleet.slo.budget import allows, pool_budgets
from fleet.spec.loader import load_or_report
from fleet.spec.stack import FleetSpec
from llmfleet.local.status import UNAUTHORIZED

__all__ = ["add_arguments", "format_budgets", "from_control_plane", "from_prometheus", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="local", help="stack whose pools to show (default: local)")
    parser.add_argument("--prometheus", default=None, metavar="URL", help="compute from this Prometheus")
    parser.add_argument("--control-plane", default=None, help="control plane URL (default: from the stack)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def from_control_plane(client: httpx.Client, spec: FleetSpec) -> list[PoolBudget]:
    return [
        PoolBudget.model_validate_json(client.get(f"/v1/pools/{pool.name}/budget").raise_for_status().content)
        for pool in spec.pools
    ]


async def from_prometheus(url: str, spec: FleetSpec, now: float) -> list[PoolBudget]:
    """Every pool's budgets read from the Prometheus at ``url``; `BudgetSourceError` when it cannot answer."""
    # The source lives with the control plane, which reads it too; only this path needs it.
    from control_plane.budget.sources import BudgetQuery, make_source, planned_intervals

    out = []
    async with httpx.AsyncClient() as client:
        source = make_source("prometheus", {"url": url}, client)
        for pool in spec.pools:
            planned = planned_intervals(pool, now - pool.slo.budget_window_s, now)
            observed = await source.observe(BudgetQuery(pool.name, pool.served_name, pool.slo, now, planned))
            budgets = pool_budgets(pool.slo, observed)
            allowed, reason = allows(pool.name, pool.slo, budgets, "a risky change")
            slos = [SloBudget.model_validate({**asdict(b), "window": pool.slo.budget_window}) for b in budgets]
            out.append(
                PoolBudget(
                    pool=pool.name,
                    source="prometheus",
                    computed_at=now,
                    freeze=pool.slo.freeze_on_exhausted_budget,
                    allows_changes=allowed,
                    reason=reason,
                    slos=slos,
                )
            )
    return out


def _count(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _duration(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    days, rest = divmod(minutes, 1440)
    return (f"{days}d" if days else "") + f"{rest // 60}h{rest % 60:02d}m"


def format_budgets(budgets: list[PoolBudget]) -> str:
    lines: list[str] = []
    for pool in budgets:
        window = pool.slos[0].window if pool.slos else "-"
        lines.append(f"pool {pool.pool}  window {window}  source {pool.source}")
        if pool.error:
            lines.append(f"  source error: {pool.error}")
        if not pool.slos:
            lines.append("  (no budget computed yet)")
        else:
            first = pool.slos[0]
            lines.append(
                f"  counted {_duration(first.covered_s)} of the window; planned restart windows excluded: "
                f"{_duration(first.excluded_s)} ({_count(first.excluded_requests)} requests)"
            )
            lines.append(
                f"  {'SLO':<13} {'TARGET':>8} {'GOOD':>10} {'BAD':>8} {'TOTAL':>10} {'BURN':>7} {'SPENT':>8} "
                f"{'REMAINING':>9}  STATUS"
            )
            for b in pool.slos:
                lines.append(
                    f"  {b.slo:<13} {b.target:>8.3%} {_count(b.good):>10} {_count(b.bad):>8} {_count(b.total):>10} "
                    f"{b.burn_rate:>6.2f}x {b.spent:>8.1%} {b.remaining:>9.1%}  {b.status}"
                )
        state = "allowed" if pool.allows_changes else "FROZEN"
        lines.append(f"  risky changes: {state} ({pool.reason})")
        lines.append("")
    return "\n".join(lines).rstrip()


def run(args: argparse.Namespace) -> int:
    loaded = load_or_report(args.stack)
    if loaded is None:
        return 2
    spec = loaded.spec
    if args.prometheus is not None:
        from control_plane.budget.sources import BudgetSourceError

        try:
            budgets = asyncio.run(from_prometheus(args.prometheus, spec, time.time()))
        except (BudgetSourceError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        url = args.control_plane or spec.control_plane.client_url
        try:
            with httpx.Client(base_url=url, timeout=10.0, auth=operator_auth(url)) as client:
                budgets = from_control_plane(client, spec)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 401:
                raise
            print(f"error: the control plane at {url} wants a credential: {UNAUTHORIZED}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(f"error: control plane at {url} did not answer ({exc}); is `llmfleet up` running?", file=sys.stderr)
            return 1
    out: Any = [b.model_dump(mode="json") for b in budgets]
    print(json.dumps(out, indent=2) if args.json else format_budgets(budgets))
    return 0
