"""Fleet overview: each pool's SLOs against the stack's targets, traffic, latency and capacity at a glance.

Rows:

* one "SLOs" row per pool, because each pool has its own targets (``pools[].slo``), drawn as thresholds:
  availability (a red area below the target), the error budget left over ``budgetWindow``, P99 TTFT and P99
  inter-token latency (a dashed line at ``ttftP99Ms`` and at ``1 / decodeTokensPerSP99``);
* traffic: requests by status; TTFT and inter-token latency at P50, P90 and P99 for every pool;
* capacity: per pool, replicas ready and the autoscaler's target against the plan (`fleet.capacity.plan.plan_pool`):
  the pool's min, the replicas its peak traffic needs, its max.

Every change of ``llmfleet_autoscaler_target_replicas`` (a scaling decision) is an annotation on every panel.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dashboard_builders

from fleet.capacity.plan import plan_pool
from fleet.spec.stack import FleetSpec, PoolSpec
from infra.dashboards.panels import (
    Annotation,
    Query,
    dashboard_uid,
    encode,
    new_dashboard,
    stat_panel,
    timeseries_panel,
)
from infra.dashboards.queries import (
    PROM_POOL_LABEL,
    REQUESTS,
    TARGET_REPLICAS,
    availability,
    error_budget_remaining,
    quantile,
    rate,
)

__all__ = ["SCALING", "fleet_overview"]

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
SCALING = Annotation(
    name="Scaling decisions",
    expr=f"changes({TARGET_REPLICAS}[1m]) > 0",
    title="{{pool}}: target replicas changed",
    tag_keys="pool",
)


def _slo_panels(pool: PoolSpec) -> list[Any]:
    slo = pool.slo
    engines = f'{PROM_POOL_LABEL}="{pool.name}"'
    ttft_s = slo.ttft_p99_ms / 1000.0
    itl_s = 1.0 / slo.decode_tokens_per_s_p99
    return [
        timeseries_panel(
            f"Availability: {pool.name}",
            "percentunit",
            [Query(availability(pool.served_name), "availability")],
            description=f"Requests to {pool.served_name} not answered with a 5xx; SLO {slo.availability:.3%}.",
            thresholds=[(None, "red"), (slo.availability, "green")],
            width=6,
        ),
        stat_panel(
            f"Error budget left ({slo.budget_window}): {pool.name}",
            "percentunit",
            Query(error_budget_remaining(pool.served_name, slo.availability, slo.budget_window), "budget"),
            [(None, "red"), (0.0, "orange"), (0.25, "green")],
            description=(
                f"1 - (5xx / requests over {slo.budget_window}) / (1 - availability target): 0 is spent, below 0 "
                "overspent. From the raw counter: requests inside planned restart windows count here, while "
                "`llmfleet slo` (llmfleet_error_budget_spent) leaves them out."
            ),
            width=6,
        ),
        timeseries_panel(
            f"TTFT P99: {pool.name}",
            "s",
            [Query(quantile(0.99, TTFT, engines), "p99")],
            description=f"Engines' time to first token; SLO {slo.ttft_p99_ms:g} ms.",
            thresholds=[(None, "green"), (ttft_s, "red")],
            width=6,
        ),
        timeseries_panel(
            f"Inter-token latency P99: {pool.name}",
            "s",
            [Query(quantile(0.99, ITL, engines), "p99")],
            description=f"Engines' time between tokens; SLO {slo.decode_tokens_per_s_p99:g} tok/s = {itl_s:.4g} s.",
            thresholds=[(None, "green"), (itl_s, "red")],
            width=6,
        ),
    ]


def _percentiles(title: str, histogram: str) -> Any:
    queries = [
        Query(quantile(q, histogram, by=PROM_POOL_LABEL), f"p{round(q * 100)} {{{{{PROM_POOL_LABEL}}}}}")
        for q in (0.5, 0.9, 0.99)
    ]
    return timeseries_panel(title, "s", queries, description="Per pool, from the engines' histograms.")


def _replicas_panel(spec: FleetSpec, pool: PoolSpec) -> Any:
    plan = plan_pool(spec, pool)
    selector = f'pool="{pool.name}"'
    return timeseries_panel(
        f"Replicas: {pool.name}",
        "short",
        [
            Query(f'sum(llmfleet_pool_replicas{{{selector},state="ready"}})', "ready"),
            Query(f"max({TARGET_REPLICAS}{{{selector}}})", "autoscaler target"),
            Query(f"vector({plan.replicas_min})", "plan: min"),
            Query(f"vector({plan.replicas_peak})", "plan: needed at peak"),
            Query(f"vector({plan.replicas_max})", "plan: max"),
        ],
        description=(
            f"Ready replicas (control plane) and the autoscaler's target; the plan: min {plan.replicas_min}, "
            f"{plan.replicas_peak} for {plan.peak_qps:g} req/s at peak, max {plan.replicas_max}."
        ),
    )


def fleet_overview(spec: FleetSpec) -> dict[str, Any]:
    """The fleet overview of ``spec``'s stack as Grafana dashboard JSON."""
    board = new_dashboard(
        dashboard_uid(spec.environment, "fleet-overview"),
        f"llmfleet {spec.environment}: fleet overview",
        "SLOs against the stack's targets, traffic, latency percentiles and replicas against the capacity plan.",
        spec.environment,
    )
    for pool in spec.pools:
        board = board.with_row(dashboard_builders.Row(f"SLOs: {pool.name} ({pool.served_name})"))
        for panel in _slo_panels(pool):
            board = board.with_panel(panel)
    board = (
        board.with_row(dashboard_builders.Row("Traffic and latency"))
        .with_panel(
            timeseries_panel(
                "Requests by status",
                "reqps",
                [Query(rate(REQUESTS, by="status"), "{{status}}")],
                description="Answers of every gateway, by HTTP status.",
                stacked=True,
            )
        )
        .with_panel(_percentiles("Time to first token", TTFT))
        .with_panel(_percentiles("Inter-token latency", ITL))
        .with_row(dashboard_builders.Row("Capacity"))
    )
    for pool in spec.pools:
        board = board.with_panel(_replicas_panel(spec, pool))
    return encode(board, [SCALING])
