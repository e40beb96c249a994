"""Metrics: the control plane's Prometheus series (`ControlPlaneMetrics`) and ``GET /metrics``.

    GET    /metrics                           Prometheus text

The counters move as reports and lease calls arrive; the gauges are read from the control plane when scraped.
"""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from control_plane.api.deps import control_plane
from control_plane.plane import ControlPlane
from control_plane.rollouts import RolloutCollector
from fleet.protocol.control_api import errors
from fleet.protocol.wire import ReplicaState

__all__ = ["REPORTED_GAUGE_STATES", "ControlPlaneMetrics", "router", "series"]

# The replicas-per-state gauge's states: what agents report, less ``stopped`` (its agent is gone).
REPORTED_GAUGE_STATES = tuple(s for s in ReplicaState if s not in (ReplicaState.LAUNCHING, ReplicaState.STOPPED))

router = APIRouter()


class ControlPlaneMetrics:
    """The control plane's series, registered on ``registry`` (once per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reports = Counter(
            "llmfleet_control_plane_reports_total", "Load reports received", ["pool"], registry=registry
        )
        self.replicas = Gauge(
            "llmfleet_pool_replicas", "Replicas known per pool and state", ["pool", "state"], registry=registry
        )
        self.stale = Gauge(
            "llmfleet_pool_stale_replicas", "Replicas whose reports stopped", ["pool"], registry=registry
        )
        self.target = Gauge("llmfleet_autoscaler_target_replicas", "Last decided target", ["pool"], registry=registry)
        self.leases = Gauge("llmfleet_restart_leases", "Restart leases held", ["pool"], registry=registry)
        self.gateway_reports = Counter(
            "llmfleet_control_plane_gateway_reports_total", "Gateway reports received", ["pool"], registry=registry
        )
        self.gateway_waiting = Gauge(
            "llmfleet_gateway_reported_waiting",
            "Admission queue a gateway last reported",
            ["pool", "gateway"],
            registry=registry,
        )
        self.refused = Counter(
            "llmfleet_restart_leases_refused_total", "Lease requests refused", ["pool"], registry=registry
        )
        self.spent = Gauge(
            "llmfleet_error_budget_spent",
            "Fraction of the error budget spent over slo.budgetWindow, as last read",
            ["pool", "slo"],
            registry=registry,
        )

    @classmethod
    def of(cls, cp: ControlPlane) -> ControlPlaneMetrics:
        """The series of ``cp``, registered on ``cp.metrics`` with its rollouts' collector."""
        metrics = cls(cp.metrics)
        cp.metrics.register(RolloutCollector(cp.rollouts))
        return metrics

    def observe(self, cp: ControlPlane) -> None:
        """Set the gauges from ``cp`` as it is now."""
        now = cp.clock.time()
        for pool in cp.spec.engine_pools:
            seen = cp.registry.seen(pool.name, now)
            for state in REPORTED_GAUGE_STATES:
                self.replicas.labels(pool.name, state).set(sum(1 for s in seen if s.report.state == state))
            self.stale.labels(pool.name).set(sum(1 for s in seen if s.stale))
            self.leases.labels(pool.name).set(len(cp.leases.holders(pool.name, now)))
            if cp.loop is not None and pool.name in cp.loop.last:
                self.target.labels(pool.name).set(cp.loop.last[pool.name].target)
            for budget in cp.budgets.latest[pool.name].budgets:
                self.spent.labels(pool.name, budget.slo).set(budget.spent)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def _series(request: Request) -> ControlPlaneMetrics:
    return cast(ControlPlaneMetrics, request.app.state.metrics)


series = Depends(_series)  # the app's series, for the handlers that count


@router.get("/metrics", response_class=PlainTextResponse, responses=errors(plain_text=True))
async def metrics(cp: ControlPlane = control_plane, out: ControlPlaneMetrics = series) -> PlainTextResponse:
    """Prometheus text: reports received, replicas per state, stale replicas, targets, leases."""
    out.observe(cp)
    return PlainTextResponse(out.render())
