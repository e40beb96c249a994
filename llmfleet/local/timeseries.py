"""Timeseries: per-interval request rates, latency quantiles, errors by status and ready replicas over a run.

Two producers fill the same `Timeline`: `Recorder` from events a client saw (``llmfleet load``: each request sent
and how it ended, with explicit timestamps), and ``llmfleet up --live`` from successive scrapes of the gateway's
and control plane's endpoints (`llmfleet.local.live`). `llmfleet.local.plots` draws a timeline, so benchmarks that
produce one get the same figure. Pure: no clock, no I/O; times are seconds since the run's start.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Interval", "ReadySample", "Recorder", "Timeline", "quantile"]


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Interval:
    """What happened in ``[start_s, start_s + length_s)``: requests sent, requests completed (ok), errors by
    status (``"503"``, ``"conn"``, ...), and latency quantiles of the requests that completed in it (None: none)."""

    start_s: float
    length_s: float
    sent: int
    completed: int
    errors: Mapping[str, int]
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None

    def per_s(self, count: int) -> float:
        return count / self.length_s if self.length_s > 0 else 0.0


@dataclass(frozen=True)
class ReadySample:
    """``ready`` replicas of ``pool`` at ``at_s``."""

    at_s: float
    pool: str
    ready: int


@dataclass(frozen=True)
class Timeline:
    """A run as consecutive intervals plus the ready-replica samples taken during it."""

    intervals: tuple[Interval, ...] = ()
    ready: tuple[ReadySample, ...] = ()

    @property
    def sent(self) -> int:
        return sum(i.sent for i in self.intervals)

    @property
    def completed(self) -> int:
        return sum(i.completed for i in self.intervals)

    @property
    def errors(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for interval in self.intervals:
            total.update(interval.errors)
        return dict(total)

    def statuses(self) -> list[str]:
        """Every error status seen, sorted."""
        return sorted({status for i in self.intervals for status in i.errors})

    def pools(self) -> list[str]:
        return sorted({s.pool for s in self.ready})

    def with_interval(self, interval: Interval, ready: Sequence[ReadySample] = (), keep: int | None = None) -> Timeline:
        """This timeline with ``interval`` and ``ready`` appended; only the last ``keep`` intervals (and the ready
        samples from their start on) when ``keep`` is given, so a long-running view stays bounded."""
        intervals = (*self.intervals, interval)
        samples = (*self.ready, *ready)
        if keep is not None and len(intervals) > keep:
            intervals = intervals[-keep:]
            samples = tuple(s for s in samples if s.at_s >= intervals[0].start_s)
        return Timeline(intervals, samples)


@dataclass
class _Finished:
    at_s: float
    error: str | None
    ttft_s: float | None
    latency_s: float | None


@dataclass
class Recorder:
    """Collects a client's events, then buckets them into a `Timeline`.

    A request counts as sent in the interval it was sent in, and as completed or failed in the interval it ended
    in; its TTFT and latency go to the interval it ended in. So every request is in exactly one interval's
    ``sent`` and, once it has ended, in exactly one interval's ``completed`` or ``errors``.
    """

    sent_at: list[float] = field(default_factory=list)
    finished: list[_Finished] = field(default_factory=list)
    ready_samples: list[ReadySample] = field(default_factory=list)

    def on_sent(self, at_s: float) -> None:
        self.sent_at.append(at_s)

    def on_ok(self, at_s: float, latency_s: float, ttft_s: float | None = None) -> None:
        """A request that ended well at ``at_s`` after ``latency_s``; ``ttft_s`` for a streamed one."""
        self.finished.append(_Finished(at_s, None, ttft_s, latency_s))

    def on_error(self, at_s: float, status: str) -> None:
        """A request that failed at ``at_s`` with ``status`` (an HTTP status, ``"conn"``, ``"stream"``)."""
        self.finished.append(_Finished(at_s, status, None, None))

    def on_ready(self, at_s: float, ready: Mapping[str, int]) -> None:
        """Ready replicas per pool, as the control plane reported them at ``at_s``."""
        self.ready_samples.extend(ReadySample(at_s, pool, n) for pool, n in sorted(ready.items()))

    def timeline(self, interval_s: float = 1.0, end_s: float | None = None) -> Timeline:
        """Intervals of ``interval_s`` from 0 to the last event (or ``end_s``, whichever is later)."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s}")
        last = max([0.0, end_s or 0.0, *self.sent_at, *(f.at_s for f in self.finished)])
        count = max(1, math.ceil(last / interval_s))  # an event exactly at the end falls in the last interval

        def slot(at_s: float) -> int:
            return min(count - 1, max(0, int(at_s // interval_s)))

        sent = [0] * count
        for at in self.sent_at:
            sent[slot(at)] += 1
        done: list[list[_Finished]] = [[] for _ in range(count)]
        for f in self.finished:
            done[slot(f.at_s)].append(f)
        intervals = []
        for n in range(count):
            ok = [f for f in done[n] if f.error is None]
            ttft = [f.ttft_s for f in ok if f.ttft_s is not None]
            latency = [f.latency_s for f in ok if f.latency_s is not None]
            intervals.append(
                Interval(
                    start_s=n * interval_s,
                    length_s=interval_s,
                    sent=sent[n],
                    completed=len(ok),
                    errors=dict(Counter(f.error for f in done[n] if f.error is not None)),
                    ttft_p50_s=quantile(ttft, 0.5),
                    ttft_p99_s=quantile(ttft, 0.99),
                    latency_p50_s=quantile(latency, 0.5),
                    latency_p99_s=quantile(latency, 0.99),
                )
            )
        return Timeline(tuple(intervals), tuple(self.ready_samples))
