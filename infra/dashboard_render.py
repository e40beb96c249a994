"""Dashboard render: draw a Grafana dashboard's panels as one PNG from a Prometheus HTTP API, without Grafana.

For each panel (rows skipped) every target's PromQL is run as ``/api/v1/query_range`` over ``[start, end]``,
after the substitutions Grafana makes: the dashboard's variables at their current values (or ``variables``),
``$__interval`` (the step) and ``$__rate_interval`` (Grafana's ``max(step + scrape, 4 x scrape)``). Time
series are lines with their legends and the panel's thresholds as dashed lines; a stat is its last value on
the colour its thresholds give it; annotation queries are vertical lines on every time series. Panels sit in
a grid of `COLUMNS` columns, each `PANEL_PX` pixels, so the image's size follows from the panel count
(`image_size`). A query Prometheus refuses raises `RenderError` naming the panel and the expression.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from infra.dashboards.panels import substitute

__all__ = ["COLUMNS", "PANEL_PX", "RenderError", "Rendered", "image_size", "render", "run_starts", "variable_values"]

COLUMNS = 3
PANEL_PX = (600, 320)  # width, height of one panel
_DPI = 100
_POINTS = 240  # samples per series across the range, as Grafana's max data points would give
_DAY_S = 86400.0
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class RenderError(Exception):
    """Prometheus refused a panel's query (a syntax error, an unknown function) or could not be reached."""


@dataclass(frozen=True)
class Rendered:
    """The PNG `render` drew and the panels none of whose queries returned a series."""

    path: Path
    empty: list[str]


@dataclass(frozen=True)
class Series:
    label: str
    times: list[float]  # matplotlib date numbers: days since 1970-01-01, matplotlib's default epoch
    values: list[float]


def _panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard.get("panels", []) if p.get("type") != "row"]


def image_size(dashboard: Mapping[str, Any]) -> tuple[int, int]:
    """(width, height) in pixels of the PNG `render` draws for ``dashboard``."""
    rows = max(1, math.ceil(len(_panels(dashboard)) / COLUMNS))
    return COLUMNS * PANEL_PX[0], rows * PANEL_PX[1]


def variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Each template variable's current value (the data source variable: ``prometheus``)."""
    values: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        current = variable.get("current") or {}
        values[variable["name"]] = str(current.get("value", variable.get("query", "")))
    return values


def _legend(template: str, labels: Mapping[str, str]) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template) if template else str(dict(labels))


class _Prometheus:
    def __init__(self, client: httpx.Client, url: str, start: float, end: float, step_s: float) -> None:
        self.client, self.url = client, url.rstrip("/")
        self.params = {"start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}

    def query(self, expr: str, legend: str, panel: str) -> list[Series]:
        try:
            response = self.client.get(f"{self.url}/api/v1/query_range", params={"query": expr, **self.params})
        except httpx.HTTPError as exc:
            raise RenderError(f"panel {panel!r}: Prometheus at {self.url} unreachable: {exc}") from exc
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise RenderError(f"panel {panel!r}: Prometheus refused {expr!r}: {body.get('error', response.text)}")
        return [
            Series(
                _legend(legend, item["metric"]),
                [float(t) / _DAY_S for t, _ in item["values"]],
                [float(v) for _, v in item["values"]],
            )
            for item in body["data"]["result"]
        ]


def _thresholds(panel: Mapping[str, Any]) -> list[tuple[float | None, str]]:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [(s.get("value"), s.get("color", "grey")) for s in steps]


def _scale(unit: str) -> tuple[float, str]:
    return (100.0, "%") if unit == "percentunit" else (1.0, f" {unit}" if unit in ("s", "reqps") else "")


def _draw_timeseries(
    ax: Axes, panel: Mapping[str, Any], series: Sequence[Series], events: Sequence[float], span: tuple[float, float]
) -> None:
    factor, suffix = _scale(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
    for s in series:
        ax.plot(s.times, [v * factor for v in s.values], label=s.label, linewidth=1.2)
    for value, color in _thresholds(panel):
        if value is not None:
            ax.axhline(value * factor, color=color, linestyle="--", linewidth=1)
    for at in events:
        ax.axvline(at, color="orange", linewidth=0.8, alpha=0.7)
    ax.xaxis_date(tz=UTC)
    ax.set_xlim(span[0] / _DAY_S, span[1] / _DAY_S)  # every panel the whole range, data or not
    ax.set_ylabel(suffix.strip())
    ax.tick_params(labelsize=7)
    if series:
        ax.legend(fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _draw_stat(ax: Axes, panel: Mapping[str, Any], series: Sequence[Series]) -> None:
    factor, suffix = _scale(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
    last = next((v for s in series for v in reversed(s.values) if not math.isnan(v)), None)
    color = "lightgrey"
    if last is not None:
        for value, step_color in _thresholds(panel):
            if value is None or last >= value:
                color = step_color
    ax.set_facecolor(color)
    text = "no data" if last is None else f"{_number(last * factor)}{suffix}"
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=28, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def run_starts(times: Sequence[float], step_s: float) -> list[float]:
    """The first of each run of consecutive samples in ``times`` (matplotlib date numbers, ``step_s`` apart within
    a run). A gap counts from one and a half steps: in days, two samples one step apart differ by a step give or
    take float rounding."""
    return [t for i, t in enumerate(times) if i == 0 or (t - times[i - 1]) * _DAY_S > 1.5 * step_s]


def _event_times(
    prom: _Prometheus, dashboard: Mapping[str, Any], values: Mapping[str, str], step_s: float
) -> list[float]:
    """The start of each run of samples of each enabled annotation query (one event, not one per step)."""
    events: list[float] = []
    for note in dashboard.get("annotations", {}).get("list", []):
        if note.get("enable") and note.get("expr"):
            for s in prom.query(substitute(note["expr"], values), "", f"annotation {note.get('name')}"):
                events += run_starts(s.times, step_s)
    return events


def render(
    dashboard: Mapping[str, Any],
    prometheus_url: str,
    start: float,
    end: float,
    out_png: Path,
    *,
    variables: Mapping[str, str] | None = None,
    scrape_interval_s: float = 15.0,
    client: httpx.Client | None = None,
) -> Rendered:
    """Draw ``dashboard`` over ``[start, end]`` (unix seconds) from the Prometheus at ``prometheus_url`` into
    ``out_png``. ``variables`` override the dashboard's current values."""
    step = max(1.0, math.ceil((end - start) / _POINTS))
    rate_interval = max(step + scrape_interval_s, 4 * scrape_interval_s)
    values = {
        **variable_values(dashboard),
        **(variables or {}),
        "__interval": f"{step:g}s",
        "__rate_interval": f"{rate_interval:g}s",
    }
    panels = _panels(dashboard)
    width, height = image_size(dashboard)
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(figure)
    figure.suptitle(str(dashboard.get("title", "")), fontsize=11)
    rows = height // PANEL_PX[1]
    empty: list[str] = []
    with contextlib.nullcontext(client) if client is not None else httpx.Client(timeout=30.0) as http:
        prom = _Prometheus(http, prometheus_url, start, end, step)
        events = _event_times(prom, dashboard, values, step)
        for index, panel in enumerate(panels):
            ax = figure.add_subplot(rows, COLUMNS, index + 1)
            title = str(panel.get("title", ""))
            series = [
                s
                for target in panel.get("targets", [])
                for s in prom.query(substitute(target["expr"], values), target.get("legendFormat", ""), title)
            ]
            ax.set_title(title, fontsize=9)
            if not series:
                empty.append(title)
            if panel.get("type") == "stat":
                _draw_stat(ax, panel, series)
            else:
                _draw_timeseries(ax, panel, series, events, (start, end))
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, dpi=_DPI)
    return Rendered(out_png, empty)
