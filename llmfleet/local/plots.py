"""Plots: a `Timeline` as a PNG, one panel per series, time on the x axis.

Panels: request rate (sent and completed per second), TTFT p50/p99, end-to-end latency p50/p99, errors per second
by status, ready replicas per pool. matplotlib is imported only when a figure is drawn (Agg backend, no display),
so the commands that never plot do not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from llmfleet.local.timeseries import Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["pyplot", "write_timeline_png"]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ms(values: Sequence[float | None]) -> list[float]:
    # NaN leaves a gap in the line where an interval had no completed request, rather than drawing a false zero.
    return [float("nan") if v is None else v * 1000.0 for v in values]


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.6, text, transform=ax.transAxes, ha="center", va="center", color="grey")


def write_timeline_png(
    path: Path, timeline: Timeline, title: str, *, dpi: int = 90, rates: tuple[str, str] = ("sent", "completed")
) -> Path:
    """Draw ``timeline`` into ``path`` (parents created) under ``title``; returns ``path``. ``rates`` names the
    intervals' two counts (a client's sent and completed; a gateway's answered and ok)."""
    plt = pyplot()
    intervals = timeline.intervals
    xs = [i.start_s for i in intervals]
    fig, axes = plt.subplots(5, 1, figsize=(9, 11), sharex=True)
    rate, ttft, latency, errors, ready = axes

    rate.plot(xs, [i.per_s(i.sent) for i in intervals], label=rates[0], lw=1.2)
    rate.plot(xs, [i.per_s(i.completed) for i in intervals], label=rates[1], lw=1.2, ls="--")
    rate.set_ylabel("requests / s")
    rate.legend(fontsize=8, loc="upper right")

    for ax, (p50, p99), name in (
        (ttft, ([i.ttft_p50_s for i in intervals], [i.ttft_p99_s for i in intervals]), "TTFT"),
        (latency, ([i.latency_p50_s for i in intervals], [i.latency_p99_s for i in intervals]), "latency"),
    ):
        if any(v is not None for v in p99):
            ax.plot(xs, _ms(p50), label="p50", lw=1.0, marker=".", ms=3)
            ax.plot(xs, _ms(p99), label="p99", lw=1.0, marker=".", ms=3)
            ax.legend(fontsize=8, loc="upper right")
        else:
            _empty(ax, "no completed request")
        ax.set_ylabel(f"{name} (ms)")

    _errors(errors, xs, timeline)
    _ready(ready, timeline)

    for ax in axes:
        ax.grid(True, lw=0.3, alpha=0.6)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: an image viewer reloading a live PNG never reads half a file.
    partial = path.with_name(f".{path.name}.partial")
    fig.savefig(partial, dpi=dpi, format="png")
    plt.close(fig)
    os.replace(partial, path)
    return path


def _errors(ax: Axes, xs: list[float], timeline: Timeline) -> None:
    """Errors per second, one line per status; a flat grey line when there were none."""
    intervals = timeline.intervals
    statuses = timeline.statuses()
    for status in statuses:
        ax.plot(xs, [i.per_s(i.errors.get(status, 0)) for i in intervals], label=status, lw=1.0)
    if statuses:
        ax.legend(fontsize=8, loc="upper right", title="status", title_fontsize=8)
    else:
        ax.plot(xs, [0.0] * len(xs), lw=1.0, color="grey")
        ax.set_ylim(-0.05, 1.0)
        _empty(ax, "no errors")
    ax.set_ylabel("errors / s")


def _ready(ax: Axes, timeline: Timeline) -> None:
    """Ready replicas per pool as steps (a replica is ready from its sample until the next one)."""
    pools = timeline.pools()
    for pool in pools:
        samples = [s for s in timeline.ready if s.pool == pool]
        ax.step([s.at_s for s in samples], [s.ready for s in samples], where="post", label=pool, lw=1.2)
    if pools:
        ax.legend(fontsize=8, loc="upper right", title="pool", title_fontsize=8)
        ax.set_ylim(bottom=0)
    else:
        _empty(ax, "control plane not reachable")
    ax.set_ylabel("ready replicas")
    ax.set_xlabel("seconds since start")
