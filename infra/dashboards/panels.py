"""Panels: the few grafana-foundation-sdk shapes the fleet's dashboards are made of, and their JSON.

Every panel queries the dashboard's ``datasource`` variable (a Prometheus data source chosen in Grafana), so
one JSON works against whichever Prometheus the cluster has. `encode` turns a dashboard builder into plain
JSON: panel ids numbered in order, and the fields of a Prometheus annotation query the SDK does not model
(``titleFormat``, ``tagKeys``, ``step``) added, so the output is what Grafana itself would save.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import (
    common as common_builders,
    dashboard as dashboard_builders,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard as models

__all__ = [
    "DATASOURCE",
    "Annotation",
    "Query",
    "custom_variable",
    "dashboard_uid",
    "encode",
    "new_dashboard",
    "stat_panel",
    "substitute",
    "timeseries_panel",
]

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
_UID_MAX = 40  # Grafana refuses longer dashboard uids
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    """One panel target: PromQL and the legend Grafana draws for each of its series."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Annotation:
    """A Prometheus annotation query: an event wherever ``expr`` has a sample, titled by ``title``."""

    name: str
    expr: str
    title: str
    tag_keys: str
    step: str = "60s"
    color: str = "orange"


def dashboard_uid(environment: str, name: str) -> str:
    """``llmfleet-<environment>-<name>``: the same on every generation, so Grafana links and bookmarks keep
    working; a sha256 suffix replaces the tail when that would pass Grafana's 40 characters."""
    uid = f"llmfleet-{environment}-{name}"
    if len(uid) <= _UID_MAX:
        return uid
    digest = hashlib.sha256(uid.encode()).hexdigest()[:10]
    return f"{uid[: _UID_MAX - 11]}-{digest}"


def new_dashboard(uid: str, title: str, description: str, environment: str) -> dashboard_builders.Dashboard:
    """An empty dashboard with the ``datasource`` variable, the last 6 hours, refreshed every 30 s."""
    return (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["llmfleet", environment])
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("utc")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )


def custom_variable(name: str, label: str, values: Sequence[str]) -> dashboard_builders.CustomVariable:
    """A variable over the stack's own ``values`` (its pools, its tenants), the first selected."""
    first = values[0]
    return (
        dashboard_builders.CustomVariable(name)
        .label(label)
        .values(",".join(values))
        .current(models.VariableOption(text=first, value=first, selected=True))
    )


def _targets(queries: Sequence[Query]) -> list[Builder[variants.Dataquery]]:
    return [
        prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i)).range()
        for i, q in enumerate(queries)
    ]


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dashboard_builders.ThresholdsConfig:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(models.ThresholdsMode.ABSOLUTE)
        .steps([models.Threshold(value=value, color=color) for value, color in steps])
    )


def timeseries_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    description: str = "",
    thresholds: Sequence[tuple[float | None, str]] = (),
    stacked: bool = False,
    width: int = 12,
) -> timeseries.Panel:
    """A line graph; ``thresholds`` (value, colour) are drawn as dashed lines (the first value is None: the
    colour below the first line)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(width)
        .height(8)
        .fill_opacity(10 if not stacked else 40)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if thresholds:
        panel = panel.thresholds(_thresholds(thresholds)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    return panel


def stat_panel(
    title: str,
    unit: str,
    query: Query,
    thresholds: Sequence[tuple[float | None, str]],
    *,
    description: str = "",
    width: int = 6,
) -> stat.Panel:
    """One big number (the query's last value), coloured by ``thresholds``."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .decimals(3)
        .targets(_targets([query]))
        .thresholds(_thresholds(thresholds))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .span(width)
        .height(8)
    )


def encode(board: dashboard_builders.Dashboard, annotations: Sequence[Annotation] = ()) -> dict[str, Any]:
    """The dashboard's JSON model (plain dicts and lists), with ``annotations`` as Prometheus queries."""
    for note in annotations:
        board = board.annotation(
            dashboard_builders.AnnotationQuery()
            .name(note.name)
            .datasource(DATASOURCE)
            .expr(note.expr)
            .icon_color(note.color)
            .enable(True)
        )
    model: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for number, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = number
    for entry, note in zip(model["annotations"].get("list", []), annotations, strict=True):
        entry.update({"titleFormat": note.title, "tagKeys": note.tag_keys, "step": note.step})
    return model


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``$name`` / ``${name}`` replaced by ``values[name]`` (what Grafana does before it sends a
    query); KeyError naming a variable that ``values`` lacks."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} (have: {', '.join(sorted(values))})")
        return values[name]

    return _VARIABLE.sub(one, text)
