"""Tenant dashboard: one tenant's traffic through the gateways, the tenant chosen with the ``tenant`` variable.

Tokens in (prompt) and out (completion), requests by status, quota refusals (429) by model, the TTFT the
tenant saw at the gateway, and the admission queue's wait by priority. The queue is shared by priority, not by
tenant (``llmfleet_gateway_queue_wait_seconds{model, priority}``): the panel's description says which
priority each tenant has.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dashboard_builders, timeseries

from fleet.spec.stack import FleetSpec
from infra.dashboards.panels import (
    Query,
    custom_variable,
    dashboard_uid,
    encode,
    new_dashboard,
    timeseries_panel as panel,
)
from infra.dashboards.queries import REQUESTS, quantile, rate

__all__ = ["tenant_dashboard"]

TENANT = 'tenant="$tenant"'


def _traffic_panels() -> list[timeseries.Panel]:
    """The tenant's tokens, requests by status, quota refusals and TTFT at the gateway."""
    return [
        panel(
            "Tokens in and out",
            "short",
            [Query(rate("llmfleet_gateway_tokens_total", TENANT, by="direction"), "{{direction}}")],
            description="Tokens per second: in = prompt, out = completion.",
        ),
        panel(
            "Requests by status",
            "reqps",
            [Query(rate(REQUESTS, TENANT, by="status"), "{{status}}")],
            stacked=True,
        ),
        panel(
            "Quota refusals (429)",
            "reqps",
            [Query(rate(REQUESTS, f'{TENANT},status="429"', by="model"), "{{model}}")],
            description="Requests refused for the tenant's rate, token or concurrency quota.",
        ),
        panel(
            "TTFT at the gateway",
            "s",
            [Query(quantile(q, "llmfleet_gateway_ttft_seconds", TENANT), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            description="Time to first token as the tenant saw it: admission wait and retries included.",
        ),
    ]


def _queue_panel(spec: FleetSpec) -> timeseries.Panel:
    """Admission queue waits by priority, with the tenants' priorities in its description."""
    priorities = ", ".join(f"{t.name} {t.priority}" for t in spec.tenants)
    return panel(
        "Admission queue wait by priority",
        "s",
        [
            Query(
                quantile(q, "llmfleet_gateway_queue_wait_seconds", by="priority"),
                f"p{round(q * 100)} priority {{{{priority}}}}",
            )
            for q in (0.5, 0.99)
        ],
        description=f"Waits by priority (higher goes first); tenants' priorities: {priorities}.",
        width=24,
    )


def tenant_dashboard(spec: FleetSpec) -> dict[str, Any]:
    """The per-tenant dashboard of ``spec``'s stack as Grafana dashboard JSON."""
    board = (
        new_dashboard(
            dashboard_uid(spec.environment, "tenant"),
            f"llmfleet {spec.environment}: tenant",
            "One tenant's tokens, requests, quota refusals and admission wait.",
            spec.environment,
        )
        .with_variable(custom_variable("tenant", "Tenant", [t.name for t in spec.tenants]))
        .with_row(dashboard_builders.Row("Traffic"))
    )
    for traffic in _traffic_panels():
        board = board.with_panel(traffic)
    board = board.with_row(dashboard_builders.Row("Admission queue")).with_panel(_queue_panel(spec))
    return encode(board)
