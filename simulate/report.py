"""What a replay prints: one row per configuration, the yardsticks, and (``--plot``) PNGs: the replay over time,
the frontier of fixed sizes with each scaler's point, and routers side by side at each fixed size.

With an ``oracle-kv`` row in the run (`simulate.kv_oracle`), each row of the same scaling (and fleet size) gets
``/oracle``: its prompt tokens served from cache over the oracle router's, and `miss_split` divides its miss
(1 - hit) into what the workload cannot reuse (1 - the infinite shared cache's hit rate), what the fleet's KV
memory cannot hold (that rate - the oracle's hit) and what routing lost (the oracle's hit - the row's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from simulate.replay import Prepared
from simulate.result import Result, busy_spread, quantile

__all__ = [
    "ORACLE_ROUTING",
    "Row",
    "miss_split",
    "oracle_shares",
    "row",
    "table",
    "write_frontier_plot",
    "write_plot",
    "write_routing_plot",
]

ORACLE_ROUTING = "oracle-kv"

Row = dict[str, float | int | str]


def row(result: Result, prepared: Prepared) -> Row:
    """The figures of one configuration (times in seconds, shares in [0, 1])."""
    slo = prepared.pool.slo.ttft_p99_ms / 1000.0
    ttfts, itls = sorted(result.ttfts), sorted(result.itls)
    within = sum(1 for v in ttfts if v <= slo)  # a rejected or unrouted request misses the SLO
    feasible = result.requests - result.floor_requests
    feasible_within = sum(1 for v in result.feasible_ttfts if v <= slo)
    capacity = result.replica_s * prepared.plan.per_replica_qps
    hit = result.cached_tokens / result.prompt_tokens if result.prompt_tokens else 0.0
    routing, _, scaling = result.name.partition(" / ")
    return {
        "configuration": result.name,
        "routing": routing,
        "scaling": scaling,  # with the fleet size of a ``fixed N`` row
        "replica_h": result.replica_s / 3600.0,
        "x_bound": result.replica_s / prepared.bound_replica_s if prepared.bound_replica_s else math.nan,
        "peak": result.peak_replicas,
        "busy": result.busy_s / result.replica_s if result.replica_s else 0.0,
        "node_h": result.node_s / 3600.0,
        "paid_gpu_h": result.paid_gpu_s / 3600.0,
        # engine busy time of every GPU a replica holds, over the GPU time paid for (whole nodes)
        "paid_busy": result.busy_s * result.gpus_per_replica / result.paid_gpu_s if result.paid_gpu_s else 0.0,
        "served_per_capacity": result.completed / capacity if capacity else 0.0,
        "ttft_p50": quantile(ttfts, 0.5),
        "ttft_p99": quantile(ttfts, 0.99),
        "itl_p50": quantile(itls, 0.5),
        "itl_p99": quantile(itls, 0.99),
        "within_slo": within / result.requests if result.requests else 0.0,
        # among the requests that could meet the SLO (their prefill alone fits it): the floor set apart
        "within_slo_feasible": feasible_within / feasible if feasible else math.nan,
        "rejected": result.rejected + result.unrouted,
        "hit": hit,
        "cached_tokens": result.cached_tokens,
        "hit_share": hit / prepared.cache_ceiling if prepared.cache_ceiling else math.nan,
        "oracle_share": math.nan,  # set by `oracle_shares` when the run has the oracle router's row
        "spread": busy_spread(result.replica_busy),
        "preemptions": result.preemptions,
        "wall_s": result.wall_s,
    }


def oracle_shares(rows: Sequence[Row]) -> list[Row]:
    """``rows`` with ``oracle_share``: cached prompt tokens over those of the ``oracle-kv`` row of the same scaling
    and fleet size (NaN without one, or when the oracle served none from cache)."""
    oracle = {r["scaling"]: int(r["cached_tokens"]) for r in rows if r["routing"] == ORACLE_ROUTING}
    out = []
    for r in rows:
        base = oracle.get(r["scaling"], 0)
        out.append({**r, "oracle_share": int(r["cached_tokens"]) / base if base else math.nan})
    return out


def miss_split(rows: Sequence[Row], ceiling: float) -> list[str]:
    """One line per row that has an oracle row: its miss as workload + KV memory + routing (shares of prompt
    tokens; the last two are negative where the oracle router did worse, which its greedy choice allows)."""
    oracle = {r["scaling"]: float(r["hit"]) for r in rows if r["routing"] == ORACLE_ROUTING}
    lines = []
    for r in rows:
        if r["scaling"] not in oracle:
            continue
        hit, best = float(r["hit"]), oracle[str(r["scaling"])]
        lines.append(
            f"  {r['configuration']!s}: miss {1 - hit:.1%} = {1 - ceiling:.1%} the workload cannot reuse + "
            f"{ceiling - best:.1%} the fleet's KV memory cannot hold + {best - hit:.1%} lost by routing"
        )
    return lines


def _share(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2%}"


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.0%}"


def _ratio(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1000:.0f}ms"


def table(rows: Sequence[Row]) -> str:
    """The comparison table, one line per configuration."""
    width = max(13, *(len(str(r["configuration"])) for r in rows))
    oracle_header = f" {'/oracle':>7}" if any(not math.isnan(float(r["oracle_share"])) for r in rows) else ""
    header = (
        f"{'routing / scaling':<{width}} {'rep-h':>6} {'xbound':>6} {'peak':>4} {'busy':>5} {'paid':>5} "
        f"{'node-h':>6} {'GPU-h':>6} {'srv/cap':>7} "
        f"{'TTFT p50':>8} {'p99':>7} {'ITL p50':>7} {'p99':>6} {'in-SLO':>7} {'feasible':>8} {'reject':>6} "
        f"{'hit':>5} {'/ceil':>5}{oracle_header} {'spread':>6} {'preempt':>7} {'wall':>5}"
    )
    lines = [header]
    for r in rows:
        share = float(r["hit_share"])
        share_of_oracle = float(r["oracle_share"])
        oracle = "" if not oracle_header else f" {'-' if math.isnan(share_of_oracle) else f'{share_of_oracle:.1%}':>7}"
        lines.append(
            f"{r['configuration']!s:<{width}} {float(r['replica_h']):>6.2f} {float(r['x_bound']):>6.2f} "
            f"{int(r['peak']):>4} {float(r['busy']):>5.0%} {float(r['paid_busy']):>5.0%} {float(r['node_h']):>6.2f} "
            f"{float(r['paid_gpu_h']):>6.2f} {float(r['served_per_capacity']):>7.0%} "
            f"{_ms(float(r['ttft_p50'])):>8} {_ms(float(r['ttft_p99'])):>7} {_ms(float(r['itl_p50'])):>7} "
            f"{_ms(float(r['itl_p99'])):>6} {float(r['within_slo']):>7.2%} "
            f"{_share(float(r['within_slo_feasible'])):>8} {int(r['rejected']):>6} "
            f"{float(r['hit']):>5.0%} {_pct(share):>5}{oracle} {_ratio(float(r['spread'])):>6} "
            f"{int(r['preemptions']):>7} {float(r['wall_s']):>4.0f}s"
        )
    return "\n".join(lines)


def write_plot(
    path: Path, prepared: Prepared, results: Sequence[Result], interval_s: float, bound_interval_s: float
) -> None:
    """A PNG: arrivals per second, replicas per configuration against the clairvoyant need, TTFT p99 and the
    gateway queue per control interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    end = max([prepared.trace[-1].t, *(r.end_s for r in results)]) if prepared.trace else 0.0
    buckets = [0] * (int(end // interval_s) + 1)
    for req in prepared.trace:
        buckets[int(req.t // interval_s)] += 1
    xs = [i * interval_s for i in range(len(buckets))]
    axes[0].plot(xs, [b / interval_s for b in buckets], color="black", lw=0.8)
    axes[0].set_ylabel("arrivals / s")
    need_x = [i * bound_interval_s for i in range(len(prepared.needed) + 1)]
    need = [*prepared.needed, *prepared.needed[-1:]]  # the last interval drawn to its end
    axes[1].step(need_x[: len(need)], need, where="post", color="black", lw=1.2, label="needed (clairvoyant)")
    for r in results:
        ts = [t for t, *_ in r.timeline]
        axes[1].step(ts, [n for _, n, _, _ in r.timeline], where="post", lw=0.9, label=r.name)
        axes[2].plot(ts, [p * 1000 for *_, p in r.timeline], lw=0.8, label=r.name)
        axes[3].plot(ts, [q for _, _, q, _ in r.timeline], lw=0.8, label=r.name)
    axes[1].set_ylabel("replicas")
    axes[1].legend(fontsize=7, ncol=2)
    axes[2].axhline(prepared.pool.slo.ttft_p99_ms, color="red", ls="--", lw=0.8)
    axes[2].set_ylabel("TTFT p99 (ms)")
    axes[2].set_yscale("log")
    axes[3].set_ylabel("gateway queue")
    axes[3].set_xlabel("virtual seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_frontier_plot(path: Path, title: str, fixed: Sequence[Row], scalers: Sequence[Row]) -> None:
    """A PNG: each fixed size's (paid GPU-hours, share of feasible requests within the SLO), the frontier
    through the efficient ones, and each scaler's point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(rows: Sequence[Row]) -> tuple[list[float], list[float]]:
        return [float(r["paid_gpu_h"]) for r in rows], [float(r["within_slo_feasible"]) * 100 for r in rows]

    fig, ax = plt.subplots(figsize=(9, 6))
    xs, ys = xy(fixed)
    ax.scatter(xs, ys, color="grey", s=14, label="fixed size")
    for r, x, y in zip(fixed, xs, ys, strict=True):
        ax.annotate(
            str(r["configuration"]).rsplit(" ", 1)[-1], (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points"
        )
    best: list[tuple[float, float]] = []
    for x, y in sorted(zip(xs, ys, strict=True), key=lambda p: (p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    ax.step([x for x, _ in best], [y for _, y in best], where="post", color="black", lw=1, label="frontier")
    for r in scalers:
        (x,), (y,) = xy([r])
        ax.scatter([x], [y], s=60, marker="D", label=str(r["configuration"]), zorder=3)
    ax.set_xlabel("paid GPU-hours")
    ax.set_ylabel("feasible requests within the TTFT SLO (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_routing_plot(path: Path, title: str, rows: Sequence[Row], ceiling: float) -> None:
    """A PNG of routers side by side at each fixed fleet size (``--routing a,b --fixed 5,8``): prompt tokens
    served from cache (with the infinite shared cache's rate), TTFT p50 and p99, and the load spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routings = list(dict.fromkeys(str(r["routing"]) for r in rows))
    sizes = list(dict.fromkeys(str(r["scaling"]).rsplit(" ", 1)[-1] for r in rows))
    value = {(str(r["routing"]), str(r["scaling"]).rsplit(" ", 1)[-1]): r for r in rows}
    panels = [("hit", "prompt tokens from cache (%)", 100.0), ("ttft_p50", "TTFT p50 (ms)", 1000.0),
              ("ttft_p99", "TTFT p99 (ms)", 1000.0), ("spread", "busiest replica / mean", 1.0)]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    width = 0.8 / len(routings)
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        for i, routing in enumerate(routings):
            ys = [
                float(value[(routing, size)][key]) * scale if (routing, size) in value else math.nan for size in sizes
            ]
            ax.bar([j + i * width for j in range(len(sizes))], ys, width, label=routing)
        if key == "hit":
            ax.axhline(ceiling * 100, color="black", lw=1, ls="--", label="infinite shared cache")
        if key == "spread":
            ax.set_ylim(bottom=1.0)
        ax.set_xticks(
            [j + width * (len(routings) - 1) / 2 for j in range(len(sizes))], [f"{s} replicas" for s in sizes]
        )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(labels), fontsize=7)
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
