"""Live: ``llmfleet up --live``: a compact text view of the running fleet, refreshed in the terminal.

Each refresh takes a `Snapshot`: the gateway's ``/metrics`` (admin port; parsed with `fleet.protocol.promtext`) and the
control plane's ``GET /v1/pools`` (ready replicas, bounds, the last decision). Two consecutive snapshots make one
`llmfleet.local.timeseries.Interval`: requests answered per second, ok and errors by status, TTFT and end-to-end
p50/p99 of the requests answered in between (from the histograms' bucket differences, as Prometheus'
``histogram_quantile(rate(...))`` would). `render` is a pure function of two snapshots; `LiveView` does the HTTP and
keeps the recent intervals, which ``--live-png`` draws with `llmfleet.local.plots`.

A part that does not answer shows as ``unreachable``; its numbers are left out, never shown as zero.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from fleet.protocol import promtext
from llmfleet.local.timeseries import Interval, ReadySample, Timeline

__all__ = ["LiveView", "PoolView", "Screen", "Snapshot", "interval_between", "render", "snapshot"]

REQUESTS = "llmfleet_gateway_requests_total"
TTFT = "llmfleet_gateway_ttft_seconds"
E2E = "llmfleet_gateway_e2e_seconds"
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class PoolView:
    """One pool as ``GET /v1/pools`` shows it."""

    pool: str
    ready: int
    replicas: int
    min: int
    max: int
    last_decision: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Snapshot:
    """What the gateway and control plane said at ``at_s`` (seconds since the view started). ``requests`` is the
    gateway's cumulative count by status; None fields: that part did not answer."""

    at_s: float
    requests: Mapping[str, float] | None = None
    ttft: Buckets = ()
    e2e: Buckets = ()
    pools: tuple[PoolView, ...] | None = None


def snapshot(at_s: float, metrics: str | None, pools: Mapping[str, Any] | None) -> Snapshot:
    """A `Snapshot` from the gateway's metrics text and the control plane's ``/v1/pools`` JSON (None: no answer)."""
    requests: dict[str, float] | None = None
    ttft: Buckets = ()
    e2e: Buckets = ()
    if metrics is not None:
        samples = promtext.parse(metrics)
        requests = {}
        for sample in samples.get(REQUESTS, []):
            status = sample.labels.get("status", "?")
            requests[status] = requests.get(status, 0.0) + sample.value
        ttft = tuple(promtext.histogram_buckets(samples, TTFT))
        e2e = tuple(promtext.histogram_buckets(samples, E2E))
    views = None
    if pools is not None:
        views = tuple(
            PoolView(p["pool"], int(p["ready"]), int(p["replicas"]), int(p["min"]), int(p["max"]), p["last_decision"])
            for p in pools["pools"]
        )
    return Snapshot(at_s, requests, ttft, e2e, views)


def _quantile(now: Buckets, before: Buckets, q: float) -> float | None:
    return promtext.histogram_quantile(promtext.diff_buckets(list(now), list(before)), q)


def _increase(before: float, now: float) -> float:
    return now - before if now >= before else now  # a counter that went down restarted from zero


def interval_between(before: Snapshot, now: Snapshot) -> Interval:
    """What the gateway answered between two snapshots. A counter that went down (the gateway restarted) counts
    from zero rather than as negative traffic; with either scrape missing nothing is counted (an empty interval,
    the plot's gap) rather than a whole lifetime's counts at once."""
    length = max(1e-9, now.at_s - before.at_s)
    if now.requests is None or before.requests is None:
        return Interval(before.at_s, length, 0, 0, {})
    old = before.requests
    delta = {status: _increase(old.get(status, 0.0), n) for status, n in now.requests.items()}
    errors = {status: round(n) for status, n in sorted(delta.items()) if status != "200" and n > 0}
    return Interval(
        start_s=before.at_s,
        length_s=length,
        sent=round(sum(delta.values())),
        completed=round(delta.get("200", 0.0)),
        errors=errors,
        ttft_p50_s=_quantile(now.ttft, before.ttft, 0.5),
        ttft_p99_s=_quantile(now.ttft, before.ttft, 0.99),
        latency_p50_s=_quantile(now.e2e, before.e2e, 0.5),
        latency_p99_s=_quantile(now.e2e, before.e2e, 0.99),
    )


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _decision(decision: Mapping[str, Any] | None) -> str:
    if not decision:
        return "no decision yet"
    when = time.strftime("%H:%M:%S", time.localtime(float(decision["at"])))
    return f"{when} {decision['kind']} {decision['current']} -> {decision['target']}: {decision['reason']}"


def render(before: Snapshot | None, now: Snapshot, *, clock: str = "", width: int = 100) -> str:
    """The view: one line of request rates and errors, one of latencies, one per pool with its last decision."""
    lines = [f"llmfleet live{f'  {clock}' if clock else ''}"]
    if now.requests is None:
        lines += ["  gateway        unreachable", ""]
    elif before is None or before.requests is None:
        lines += ["  requests       (measuring)", ""]
    else:
        i = interval_between(before, now)
        errors = "  ".join(f"{s} {i.per_s(n):.1f}/s" for s, n in i.errors.items()) or "none"
        lines.append(f"  requests       {i.per_s(i.sent):.1f}/s   ok {i.per_s(i.completed):.1f}/s   errors {errors}")
        lines.append(
            f"  TTFT           p50 {_ms(i.ttft_p50_s)}  p99 {_ms(i.ttft_p99_s)}      "
            f"latency  p50 {_ms(i.latency_p50_s)}  p99 {_ms(i.latency_p99_s)}"
        )
    if now.pools is None:
        lines.append("  control plane  unreachable")
    for p in now.pools or ():
        lines.append(f"  pool {p.pool:<9} ready {p.ready}/{p.replicas} (min {p.min}, max {p.max})")
        lines.append(f"    last decision  {_decision(p.last_decision)}")
    return "\n".join(line[:width] for line in lines)


@dataclass
class LiveView:
    """Takes snapshots over HTTP (``gateway_admin``'s ``/metrics``, ``control_plane``'s ``/v1/pools``) and keeps
    the last ``keep`` intervals as a `Timeline` for ``--live-png``."""

    gateway_admin: str
    control_plane: str
    started: float = field(default_factory=time.monotonic)
    keep: int = 600
    last: Snapshot | None = None
    timeline: Timeline = field(default_factory=Timeline)

    def fetch(self, client: httpx.Client, now: float) -> Snapshot:
        metrics: str | None = None
        pools: dict[str, Any] | None = None
        try:
            metrics = client.get(f"{self.gateway_admin}/metrics").raise_for_status().text
        except httpx.HTTPError:
            pass
        try:
            pools = client.get(f"{self.control_plane}/v1/pools").raise_for_status().json()
        except (httpx.HTTPError, ValueError):
            pass
        return snapshot(now - self.started, metrics, pools)

    def tick(self, client: httpx.Client, now: float | None = None, clock: str = "", width: int = 100) -> str:
        """Take a snapshot, add the interval since the last one to `timeline`, return the rendered view."""
        current = self.fetch(client, time.monotonic() if now is None else now)
        before, self.last = self.last, current
        if before is not None:
            ready = [ReadySample(current.at_s, p.pool, p.ready) for p in current.pools or ()]
            self.timeline = self.timeline.with_interval(interval_between(before, current), ready, keep=self.keep)
        return render(before, current, clock=clock, width=width)


class Screen:
    """Shows successive views on ``out``: on a terminal each replaces the last in place (cursor up, clear to the
    end), elsewhere (a log file, a pipe) each is appended after a blank line."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self._lines = 0

    def show(self, view: str) -> None:
        if self.tty and self._lines:
            self.out.write(f"\x1b[{self._lines}F\x1b[J")
        self.out.write(view + "\n" if self.tty else f"\n{view}\n")
        self.out.flush()
        self._lines = view.count("\n") + 1
