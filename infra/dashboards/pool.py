"""Pool dashboard: one pool's engines and replicas, the pool chosen with the ``pool`` variable.

Engines: KV cache usage per replica (with the autoscaler's ``targetKvUsage`` as a threshold), requests running
and waiting, preemptions, prefix-cache hit rate; agents: engine restarts by reason; control plane: replicas by
state against the autoscaler's target, and what the gateways can route to. Scaling decisions of the pool are
annotations.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dashboard_builders, timeseries

from fleet.spec.stack import FleetSpec
from infra.dashboards.panels import (
    Annotation,
    Query,
    custom_variable,
    dashboard_uid,
    encode,
    new_dashboard,
    timeseries_panel as panel,
)
from infra.dashboards.queries import PROM_POOL_LABEL, TARGET_REPLICAS, rate

__all__ = ["pool_dashboard"]

ENGINES = f'{PROM_POOL_LABEL}="$pool"'
SCALING = Annotation(
    name="Scaling decisions",
    expr=f'changes({TARGET_REPLICAS}{{pool="$pool"}}[1m]) > 0',
    title="target replicas changed",
    tag_keys="pool",
)


def _engine_panels(spec: FleetSpec) -> list[timeseries.Panel]:
    """KV cache usage (against the autoscaler's target) and the engines' batches and queues."""
    return [
        panel(
            "KV cache usage",
            "percentunit",
            [
                Query(f"max by (instance) (vllm:kv_cache_usage_perc{{{ENGINES}}})", "{{instance}}"),
                Query(f"avg(vllm:kv_cache_usage_perc{{{ENGINES}}})", "mean"),
            ],
            description="Share of each engine's KV blocks in use; the dashed line is the autoscaler's target.",
            thresholds=[(None, "green"), (spec.autoscaling.target_kv_usage, "orange"), (0.98, "red")],
        ),
        panel(
            "Requests running and waiting",
            "short",
            [
                Query(f"sum(vllm:num_requests_running{{{ENGINES}}})", "running"),
                Query(f"sum(vllm:num_requests_waiting{{{ENGINES}}})", "waiting"),
            ],
            description="In the engines' batches and in their queues, all replicas together.",
        ),
    ]


def _engine_health_panels() -> list[timeseries.Panel]:
    """Preemptions, prefix-cache hit rate and the agents' engine restarts."""
    return [
        panel(
            "Preemptions",
            "short",
            [Query(rate("vllm:num_preemptions_total", ENGINES), "preemptions/s")],
            description="Sequences evicted for KV space and recomputed later: any is a sign of KV pressure.",
            width=8,
        ),
        panel(
            "Prefix-cache hit rate",
            "percentunit",
            [
                Query(
                    f"{rate('vllm:prefix_cache_hits_total', ENGINES)} "
                    f"/ {rate('vllm:prefix_cache_queries_total', ENGINES)}",
                    "hit rate",
                )
            ],
            description="Prompt tokens found in the engines' prefix caches, over the tokens looked up.",
            width=8,
        ),
        panel(
            "Engine restarts (last hour)",
            "short",
            [
                Query(
                    f"sum by (reason) (increase(llmfleet_agent_engine_restarts_total{{{ENGINES}}}[1h]))",
                    "{{reason}}",
                )
            ],
            description="Restarts the agents made, by reason (crash, hang, planned, ...).",
            width=8,
        ),
    ]


def _replicas_panel() -> timeseries.Panel:
    """Replicas by state against the autoscaler's target and what the gateways route to."""
    return panel(
        "Replicas by state",
        "short",
        [
            Query('sum by (state) (llmfleet_pool_replicas{pool="$pool"})', "{{state}}"),
            Query(f'max({TARGET_REPLICAS}{{pool="$pool"}})', "autoscaler target"),
            Query('max(llmfleet_gateway_ready_replicas{pool="$pool"})', "routable (gateways)"),
        ],
        description="Replicas the control plane knows, by state; what the gateways route to.",
        width=24,
    )


def pool_dashboard(spec: FleetSpec) -> dict[str, Any]:
    """The per-pool dashboard of ``spec``'s stack as Grafana dashboard JSON."""
    board = (
        new_dashboard(
            dashboard_uid(spec.environment, "pool"),
            f"llmfleet {spec.environment}: pool",
            "One pool's engines (KV cache, queues, preemptions, prefix cache), restarts and replicas.",
            spec.environment,
        )
        # Every pool whose replicas run engines: a P/D pool's prefill role pool (`<pool>-prefill`) too.
        .with_variable(custom_variable("pool", "Pool", [p.name for p in spec.engine_pools]))
        .with_row(dashboard_builders.Row("Engines"))
    )
    for engines in [*_engine_panels(spec), *_engine_health_panels()]:
        board = board.with_panel(engines)
    board = board.with_row(dashboard_builders.Row("Replicas")).with_panel(_replicas_panel())
    return encode(board, [SCALING])
