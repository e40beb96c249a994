"""Frontier: what each fixed fleet size buys on a trace, in paid GPU-hours and share of feasible requests in the SLO.

Every fixed size N from the pool's ``replicas.min`` to its ``replicas.max`` is one configuration of the replay
(``fixed`` with N replicas from the start, the stack's own router: `simulate.configs.Config`), simulated like every
other (`simulate.replay.run_all`), so a point is exactly the row of running fixed N. A point is (paid GPU-hours,
share of the feasible requests within the SLO); the *frontier* is the points no cheaper point beats: sorted by
paid GPU-hours, each with a higher share than every point that costs less (ties in cost keep the better share).
A smaller fleet can cost more than a larger one, since its backlog keeps the nodes paid longer.

A scaler's row sits *on or above* the frontier when no fixed size that costs the same or less in paid GPU-hours
reaches a higher share. `compare` says so for each row, with its paid GPU-hours and share against the oracle's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.spec.stack import PoolSpec
from simulate.configs import Config
from simulate.report import Row

__all__ = ["Point", "compare", "frontier", "frontier_configs", "frontier_table", "parse_sizes", "point"]


def parse_sizes(pool: PoolSpec, text: str | None) -> list[int]:
    """The fixed sizes to run: ``None`` (every size from the pool's min to its max), ``A..B`` or ``a,b,c``;
    each within the pool's bounds, else a ValueError that says what is allowed."""
    lo, hi = pool.replicas.min, pool.replicas.max
    allowed = f"sizes of pool {pool.name} are {lo}..{hi}: give A..B or a comma list within them"
    if text is None:
        return list(range(max(1, lo), hi + 1))
    try:
        if ".." in text:
            a, b = (int(v) for v in text.split("..", 1))
            sizes = list(range(a, b + 1))
        else:
            sizes = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise ValueError(f"--sizes {text!r}: {allowed}") from None
    if not sizes or sizes[0] < max(1, lo) or sizes[-1] > hi:
        raise ValueError(f"--sizes {text!r}: {allowed}")
    return sizes


def frontier_configs(routing: str, sizes: Sequence[int]) -> list[Config]:
    return [Config(routing, "fixed", n) for n in sizes]


@dataclass(frozen=True)
class Point:
    name: str
    paid_gpu_h: float
    feasible: float  # share of the feasible requests within the SLO

    @property
    def share(self) -> float:
        return -1.0 if math.isnan(self.feasible) else self.feasible


def point(r: Row) -> Point:
    return Point(str(r["configuration"]), float(r["paid_gpu_h"]), float(r["within_slo_feasible"]))


def frontier(points: Sequence[Point]) -> list[Point]:
    """The efficient points, cheapest first: each reaches a higher share than every cheaper one."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.paid_gpu_h, -p.share)):
        if not out or p.share > out[-1].share:
            out.append(p)
    return out


def compare(r: Row, points: Sequence[Point], oracle: Row | None) -> str:
    """One line: ``r`` against the fixed sizes at its cost or less, and against the oracle's row."""
    me = point(r)
    cheaper = [p for p in points if p.paid_gpu_h <= me.paid_gpu_h]
    best = max(cheaper, key=lambda p: p.share, default=None)
    if best is None or best.share <= me.share:
        verdict = "on or above the frontier"
        if best is not None:
            verdict += f" (best fixed at its cost or less: {best.name}, {best.feasible:.2%})"
    else:
        verdict = f"below the frontier: {best.name} reaches {best.feasible:.2%} on {best.paid_gpu_h:.2f} GPU-h"
    text = f"{me.name}: {me.paid_gpu_h:.2f} paid GPU-h, {me.feasible:.2%} feasible in SLO, {verdict}"
    if oracle is not None and oracle is not r:
        o = point(oracle)
        ratio = me.paid_gpu_h / o.paid_gpu_h if o.paid_gpu_h else math.nan
        text += f"; {ratio:.2f}x the oracle's paid GPU-h, {(me.feasible - o.feasible) * 100:+.1f} points vs its share"
    return text


def frontier_table(rows: Sequence[Row]) -> str:
    """One line per fixed size; ``*`` marks the frontier's points."""
    on = {p.name for p in frontier([point(r) for r in rows])}
    lines = [
        f"{'fleet':<24} {'rep-h':>6} {'node-h':>6} {'GPU-h':>7} {'busy':>5} {'paid':>5} {'TTFT p99':>8} "
        f"{'in-SLO':>7} {'feasible':>8} {'reject':>6}  frontier"
    ]
    for r in rows:
        name = str(r["configuration"])
        feasible = float(r["within_slo_feasible"])
        lines.append(
            f"{name:<24} {float(r['replica_h']):>6.2f} {float(r['node_h']):>6.2f} {float(r['paid_gpu_h']):>7.2f} "
            f"{float(r['busy']):>5.0%} {float(r['paid_busy']):>5.0%} {float(r['ttft_p99']) * 1000:>6.0f}ms "
            f"{float(r['within_slo']):>7.2%} {'-' if math.isnan(feasible) else f'{feasible:.2%}':>8} "
            f"{int(r['rejected']):>6}  {'*' if name in on else ''}"
        )
    return "\n".join(lines)
