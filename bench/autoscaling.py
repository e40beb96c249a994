"""Autoscaling bench: the shipped policies, through the same guard-rails, on one synthetic day-shape trace.

A fluid model of one pool (no processes, so it runs in a second): requests arrive at the trace's rate, each
ready replica runs up to ``SLOTS`` at once, each for ``SERVICE_S`` (so ``MU`` requests/s at full batch), the rest
wait; a new replica is ready
``COLD_START_S`` after launch. The loop ticks every ``intervalS`` and sees what agents would report (waiting,
running, KV usage, a TTFT estimate). Printed per policy: replica-hours, mean utilisation of ready replicas, peak
queue, seconds with the TTFT estimate over the SLO, and the number of scaling actions; then replica-hours and
seconds over the SLO when the burst comes 60 s to 10 min after the drop. Figures (``--plot DIR``, default
bench/out/): ``autoscaling-day.png`` (arrivals, ready replicas and the TTFT estimate over the day, per policy) and
``autoscaling-gaps.png`` (replica-hours and seconds over the SLO per gap, per policy).

    .venv/bin/python bench/autoscaling.py [--plot DIR | --no-plot]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plotting import add_plot_arguments, pyplot, save  # noqa: E402
from control_plane.scaling.context import ReplicaLoad, ScalingContext  # noqa: E402
from control_plane.scaling.policies import make_policy  # noqa: E402
from control_plane.scaling.step import ScalingState, run_policy  # noqa: E402
from fleet.spec.stack import AutoscalingSpec  # noqa: E402

MU = 6.0  # requests/s one replica completes at full batch
SLOTS = 16  # concurrent sequences per replica (maxNumSeqs)
SERVICE_S = SLOTS / MU  # mean time a request runs (Little's law at full batch)
COLD_START_S = 45.0
SLO_S = 0.3
BASE_TTFT_S = 0.08
MIN, MAX = 1, 12


def rate(t: float, gap_s: float = 180.0) -> float:
    """Requests/s: quiet, a ramp to a peak, a plateau, a sudden drop, after ``gap_s`` a second short burst."""
    if t < 120:
        return 3.0
    if t < 420:
        return 3.0 + (t - 120) * 0.17  # to ~54 req/s
    if t < 720:
        return 54.0
    if t < 720 + gap_s:
        return 10.0
    if t < 780 + gap_s:
        return 40.0
    return 5.0


@dataclass
class Result:
    name: str
    replica_s: float = 0.0
    busy_s: float = 0.0
    ready_s: float = 0.0
    peak_queue: float = 0.0
    over_slo_s: float = 0.0
    actions: int = 0
    # (t, ready replicas, TTFT estimate) once per control tick, for the figure
    timeline: list[tuple[float, int, float]] = field(default_factory=list)


def simulate(
    name: str, policy_name: str, cfg: AutoscalingSpec, end_s: float = 1500.0, dt: float = 0.5, gap_s: float = 180.0
) -> Result:
    policy = make_policy(policy_name, cfg.policy.params)
    result = Result(name)
    ready, launching = MIN, []  # launching: ready-at times
    in_system, state, history = 0.0, ScalingState(), []
    next_tick, t = 0.0, 0.0
    while t < end_s:
        launching, newly = [x for x in launching if x > t], [x for x in launching if x <= t]
        ready += len(newly)
        in_system += rate(t, gap_s) * dt
        running = min(in_system, ready * SLOTS)
        served = running * dt / SERVICE_S  # each running request finishes after SERVICE_S on average
        in_system -= served
        running = min(in_system, ready * SLOTS)
        waiting = max(0.0, in_system - ready * SLOTS)
        ttft = BASE_TTFT_S + waiting / max(ready * MU, 1e-9)
        result.replica_s += (ready + len(launching)) * dt
        result.busy_s += served / MU
        result.ready_s += ready * dt
        result.peak_queue = max(result.peak_queue, waiting)
        result.over_slo_s += dt if ttft > SLO_S else 0.0
        if t >= next_tick:
            next_tick += cfg.interval_s
            result.timeline.append((t, ready, ttft))
            per = ReplicaLoad(
                "r",
                "ready",
                waiting=waiting / ready,
                running=running / ready,
                kv_usage=min(1.0, running / ready / SLOTS * 0.5),
                ttft_p99_s=ttft,
            )
            replicas = tuple(
                ReplicaLoad(
                    f"r{i}", "ready", waiting=per.waiting, running=per.running, kv_usage=per.kv_usage, ttft_p99_s=ttft
                )
                for i in range(ready)
            )
            replicas += tuple(ReplicaLoad(f"l{i}", "launching") for i in range(len(launching)))
            history = [(ht, hv) for ht, hv in history if t - ht <= COLD_START_S] + [(t, waiting + running)]
            ctx = ScalingContext(
                pool="p",
                now=t,
                replicas=replicas,
                min_replicas=MIN,
                max_replicas=MAX,
                target_queue_per_replica=cfg.target_queue_per_replica,
                target_kv_usage=cfg.target_kv_usage,
                target_utilisation=cfg.target_utilisation,
                max_num_seqs=SLOTS,
                ttft_slo_s=SLO_S,
                cold_start_s=COLD_START_S,
                demand_history=tuple(history),
                state=state.policy,
            )
            verdict, state = run_policy(policy, ctx, cfg, state.guardrails)  # as scaling.step.decide does
            delta = verdict.target - ctx.current
            if delta > 0:
                launching += [t + COLD_START_S] * delta
                result.actions += 1
            elif delta < 0:
                drop = -delta
                cancel = min(drop, len(launching))
                launching = launching[cancel:]
                ready = max(0, ready - (drop - cancel))
                result.actions += 1
        t += dt
    return result


def plot_day(runs: list[Result], directory: Path) -> None:
    plt = pyplot()
    fig, (arrivals, replicas, ttft) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ts = [t for t, _, _ in runs[0].timeline]
    arrivals.plot(ts, [rate(t) for t in ts], color="black", lw=1.0)
    arrivals.set_ylabel("arrivals / s")
    for r in runs:
        replicas.step(ts, [n for _, n, _ in r.timeline], where="post", lw=1.0, label=r.name)
        ttft.plot(ts, [s * 1000 for _, _, s in r.timeline], lw=0.9, label=r.name)
    replicas.set_ylabel("ready replicas")
    replicas.legend(fontsize=8)
    ttft.axhline(SLO_S * 1000, color="red", ls="--", lw=0.8, label="SLO")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT estimate (ms)")
    ttft.set_xlabel("seconds")
    fig.suptitle(f"autoscaling bench: day trace, cold start {COLD_START_S:g} s (fluid model)")
    save(plt, fig, directory, "autoscaling-day.png")


def plot_gaps(gaps: tuple[float, ...], sweep: dict[str, list[Result]], directory: Path) -> None:
    plt = pyplot()
    fig, (hours, over) = plt.subplots(1, 2, figsize=(10, 4))
    for name, results in sweep.items():
        hours.plot(gaps, [r.replica_s / 3600 for r in results], marker="o", label=name)
        over.plot(gaps, [r.over_slo_s for r in results], marker="o", label=name)
    hours.set_ylabel("replica-hours")
    over.set_ylabel("seconds over the TTFT SLO")
    for ax in (hours, over):
        ax.set_xlabel("gap between the drop and the burst (s)")
        ax.grid(True, lw=0.3)
    hours.legend(fontsize=8)
    fig.suptitle("autoscaling bench: a 4x burst after a quiet gap")
    save(plt, fig, directory, "autoscaling-gaps.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_plot_arguments(parser)
    args = parser.parse_args()
    base = {"interval_s": 5.0, "scale_down_stabilization_s": 120.0, "max_scale_up_step": 4}
    runs = [
        simulate("threshold (waiting > 5)", "threshold", AutoscalingSpec(**base)),
        simulate("target-tracking", "target-tracking", AutoscalingSpec(**base)),
        simulate("target-tracking + predictive", "target-tracking", AutoscalingSpec(**base, predictive=True)),
    ]
    print(
        f"fluid pool model: {MU:g} req/s and {SLOTS} slots per replica, cold start {COLD_START_S:g}s, "
        f"TTFT SLO {SLO_S * 1000:.0f}ms, replicas {MIN}..{MAX}, trace peak 54 req/s"
    )
    print(f"{'policy':<32} {'replica-h':>9} {'util':>6} {'peak queue':>10} {'over SLO s':>10} {'actions':>8}")
    for r in runs:
        util = r.busy_s / r.ready_s if r.ready_s else math.nan
        print(
            f"{r.name:<32} {r.replica_s / 3600:>9.2f} {util:>6.0%} {r.peak_queue:>10.0f} "
            f"{r.over_slo_s:>10.0f} {r.actions:>8}"
        )
    # The burst after a drop is where policies differ most: capacity released in the quiet gap takes a cold
    # start to come back. Sweep the gap between the drop and the burst.
    gaps = (60.0, 180.0, 300.0, 420.0, 600.0)
    print("\nburst after a quiet gap: replica-hours / seconds over the SLO, per gap (s) between drop and burst")
    print(f"{'policy':<32} " + " ".join(f"{g:>11.0f}" for g in gaps))
    policies = [
        ("threshold (waiting > 5)", "threshold", {}),
        ("target-tracking", "target-tracking", {}),
        ("target-tracking + predictive", "target-tracking", {"predictive": True}),
    ]
    sweep: dict[str, list[Result]] = {}
    for name, policy, extra in policies:
        cells = []
        for gap in gaps:
            r = simulate(name, policy, AutoscalingSpec(**base, **extra), gap_s=gap)
            sweep.setdefault(name, []).append(r)
            cells.append(f"{r.replica_s / 3600:>5.2f}/{r.over_slo_s:>4.0f}s")
        print(f"{name:<32} " + " ".join(f"{c:>11}" for c in cells))
    if args.plot is not None:
        plot_day(runs, args.plot)
        plot_gaps(gaps, sweep, args.plot)


if __name__ == "__main__":
    main()
