"""A week in virtual time: the trace's hour replayed on each day of a week, by engines as old as they would be then,
with and without the pool's restart windows.

Engines slow down as they run (the seed: a 7B service lost 20% of its throughput over 72 hours to KV-cache
fragmentation). The simulator models it as a linear loss with uptime (`engine_sim.timing`, ``degradationPer72h``),
and the pool's ``restartWindow`` restarts engines up at least ``minUptimeHours`` once a day. What a window buys is
then a matter of engine age: `engine_age_h` gives the age of an engine started at the week's first midnight, at
``hour`` of day ``day``, with the window or without; each day's row replays the trace once (the stack's own router
and scaler) with the replicas ready at its start that old. Replicas the scaler adds during the hour start new.

What the rows leave out: the restarts themselves. They happen in the window (03:00 by default, at night), one
replica at a time (``maxUnavailable``), each a drain and a cold start; the replayed hour is the day's ``hour``
(14:00 by default), outside it. The window's own length is in `restart_minutes`: replicas x (drain + cold start)
over ``maxUnavailable``, which should fit ``durationMinutes``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from fleet.spec.pool import PoolSpec, RestartWindowSpec
from simulate.configs import Config
from simulate.replay import Prepared, run_all
from simulate.report import row
from simulate.result import Result

__all__ = ["DAYS", "engine_age_h", "restart_minutes", "run_week", "week_configs", "week_table"]

DAYS = 7
POLICIES = ("windows", "none")


def engine_age_h(day: int, hour: float, window: RestartWindowSpec | None) -> float:
    """Hours an engine started at day 0, 00:00 has been up at ``hour`` of ``day`` (0-based); ``window``: restarted
    at the window's start on each day it was up at least ``min_uptime_hours`` (None or disabled: never)."""
    now = day * 24.0 + hour
    started = 0.0
    if window is not None and window.enabled:
        start_h = window.start.hour + window.start.minute / 60.0
        for d in range(day + 1):
            at = d * 24.0 + start_h
            if at <= now and at - started >= window.min_uptime_hours:
                started = at
    return now - started


def restart_minutes(pool: PoolSpec, replicas: int) -> tuple[float, float]:
    """Minutes the window needs to restart ``replicas``, ``maxUnavailable`` at a time: at least a cold start each
    (drains that end at once), at most a whole drain grace and a cold start each."""
    rounds = math.ceil(replicas / pool.restart_window.max_unavailable)
    low = rounds * pool.cold_start_seconds / 60.0
    return low, low + rounds * pool.drain.grace_seconds / 60.0


def week_configs(own: Config, pool: PoolSpec, hour: float, days: int = DAYS) -> list[tuple[int, str, Config]]:
    """(day, policy, configuration) of each row: every day with the pool's window and without any."""
    rows = []
    for day in range(days):
        for policy in POLICIES:
            window = pool.restart_window if policy == "windows" else None
            age_s = engine_age_h(day, hour, window) * 3600.0
            rows.append((day, policy, dataclasses.replace(own, age_s=age_s)))
    return rows


def run_week(prepared: Prepared, own: Config, hour: float, seed: int, jobs: int) -> list[tuple[int, str, Result]]:
    """Replay every row of `week_configs`; (day, policy, result) in their order."""
    rows = week_configs(own, prepared.pool, hour)
    results = run_all(prepared, [c for _, _, c in rows], seed, jobs)
    return [(day, policy, r) for (day, policy, _), r in zip(rows, results, strict=True)]


def week_report(prepared: Prepared, own: Config, hour: float, degradation: float, seed: int, jobs: int) -> str:
    """Run the week (`run_week`) of ``prepared`` with engines losing ``degradation`` of their speed per 72 hours
    of uptime, and say what it shows: the table, then what the pool's window costs at night."""
    pool = prepared.pool
    sim = pool.engine.sim.model_copy(update={"degradation_per_72h": degradation})
    pool = pool.model_copy(update={"engine": pool.engine.model_copy(update={"sim": sim})})
    aged = dataclasses.replace(prepared, pool=pool)
    rows = run_week(aged, own, hour, seed, jobs)
    window = pool.restart_window
    replicas = max(r.peak_replicas for _, _, r in rows)
    low, high = restart_minutes(pool, replicas)
    lines = [
        f"week: {DAYS} days, the trace replayed from {hour:g}:00 of each day; engines lose {degradation:.0%} of "
        f"their speed per 72 h up; the replicas ready at the start are as old as an engine started on day 1 "
        f"at 00:00 (restarts: windows = the pool's restartWindow, none = never restarted)",
        week_table(aged, rows, degradation),
    ]
    if window.enabled:
        lines.append(
            f"restartWindow: from {window.start:%H:%M} {window.timezone} for {window.duration_minutes} min, engines "
            f"up >= {window.min_uptime_hours:g} h, {window.max_unavailable} at a time: {replicas} replicas need "
            f"{low:.0f} min (a cold start each) to {high:.0f} min (and a whole drain grace each), not in the rows"
        )
    else:
        lines.append("restartWindow: off for this pool, so both policies are the same")
    return "\n".join(lines)


def week_table(prepared: Prepared, rows: Sequence[tuple[int, str, Result]], degradation: float) -> str:
    """Day by day, with windows and without: engine age and speed, served requests per second, busy, TTFT, in-SLO."""
    head = f"{'day':>3} {'restarts':<8} {'age h':>6} {'speed':>6} {'served/s':>8} {'busy':>5} {'TTFT p50':>8} "
    head += f"{'p99':>8} {'in-SLO':>7} {'feasible':>8} {'reject':>6}"
    lines = [head]
    for day, policy, result in rows:
        r = row(result, prepared)
        age_h = result.initial_age_s / 3600.0
        speed = 1.0 - min(0.9, degradation * age_h / 72.0)
        span = max(result.end_s, 1e-9)
        lines.append(
            f"{day + 1:>3} {policy:<8} {age_h:>6.0f} {speed:>6.1%} {result.completed / span:>8.2f} "
            f"{float(r['busy']):>5.0%} {float(r['ttft_p50']) * 1000:>6.0f}ms {float(r['ttft_p99']) * 1000:>6.0f}ms "
            f"{float(r['within_slo']):>7.2%} {float(r['within_slo_feasible']):>8.2%} {int(r['rejected']):>6}"
        )
    return "\n".join(lines)
