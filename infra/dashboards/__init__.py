"""Dashboards: the fleet's Grafana dashboards, generated from its FleetSpec with grafana-foundation-sdk.

Three dashboards per stack (`DASHBOARDS`): ``fleet-overview`` (SLOs against the stack's targets, traffic,
latency, replicas against the capacity plan, scaling decisions as annotations), ``pool`` (one pool's engines
and replicas, a ``pool`` variable) and ``tenant`` (one tenant's traffic, a ``tenant`` variable). Every panel
queries the ``datasource`` variable (type prometheus); uids are ``llmfleet-<environment>-<name>``, stable
across generations. ``llmfleet dashboards`` writes them as JSON (`infra.dashboards.command`); the Pulumi
program installs them as ConfigMaps for Grafana's dashboard sidecar (`infra.dashboards.configmaps`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.spec.stack import FleetSpec
from infra.dashboards.fleet_overview import fleet_overview
from infra.dashboards.pool import pool_dashboard
from infra.dashboards.tenant import tenant_dashboard

__all__ = ["DASHBOARDS", "build_dashboards", "dashboard_text", "write_dashboards"]

# name -> builder; the name is the JSON file's stem, the ConfigMap's suffix and the uid's last part.
DASHBOARDS: dict[str, Callable[[FleetSpec], dict[str, Any]]] = {
    "fleet-overview": fleet_overview,
    "pool": pool_dashboard,
    "tenant": tenant_dashboard,
}


def build_dashboards(spec: FleetSpec) -> dict[str, dict[str, Any]]:
    """Every dashboard of ``spec``'s stack: name -> Grafana dashboard JSON model."""
    return {name: build(spec) for name, build in DASHBOARDS.items()}


def dashboard_text(model: dict[str, Any]) -> str:
    """The JSON file's text: keys sorted, indented, so a regeneration diffs only where the dashboard changed."""
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def write_dashboards(spec: FleetSpec, out: Path) -> list[Path]:
    """Write ``<out>/<name>.json`` for every dashboard; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in build_dashboards(spec).items():
        path = out / f"{name}.json"
        path.write_text(dashboard_text(model))
        written.append(path)
    return written
