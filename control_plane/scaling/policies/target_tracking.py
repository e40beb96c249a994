"""TargetTracking (``target-tracking``, the default): size the pool so queue depth, KV usage, batch
occupancy and request rate each sit at their per-replica target, and release capacity no faster than it can
come back.

    raw     = max( queue_depth / targetQueuePerReplica,
                   sum(kv_usage) / targetKvUsage,
                   running / (maxNumSeqs * targetUtilisation),
                   request_rate / (per_replica_qps * targetUtilisation) )
    desired = max( raw, envelope_prev * exp(-(now - t_prev) / tau) ),   tau = releaseTimeConstantS
                                                                        (default 6 x coldStartSeconds)

over fresh ready replicas only; ``queue_depth`` counts the engines' queues and the gateways' admission queues.
The KV term is the one that matters for long contexts (memory bounds concurrency, not QPS); the queue term
reacts first to a burst. The capacity term reads the request rate the gateways observe against the plan's
at-SLO per-replica QPS (`fleet.capacity.plan.plan_pool`): a replica's batch occupancy stays under target until it
falls off its compute cliff (~130 of 256 slots for Qwen2.5-7B on an A100 at a 200+80 mix), so the utilisation
term alone scales one cold start late on a ramp; the rate warns before the cliff. It is absent (not zero) when
no gateway reported recently or the pool has no plan.

The queue and the rate these terms read are not this tick's but the ``sustainQuantile`` (default the median)
of what the last ``sustainWindowS`` of ticks saw (default one cold start for the queue; for the rate, already a
mean over the gateways' 10 s window, a cold start less that window: `rate_window`), kept in the policy's state as
``queues`` and ``rates``: a replica launched now serves from a cold start on, so it can only answer demand that
lasts about that long. A ten-second burst (16x the mean on the Azure code trace) is one or two samples of
fifteen and moves neither median; a rise or a queue that holds for half the window does. The burst itself is
the batches' and the gateway queue's to absorb. Read tick by tick, the rate term asked for 21.6 replicas on a
ten-second burst of that trace, and the queue term for 14 on a backlog of 56 requests that seven replicas
cleared in seconds; the envelope then held either for a quarter of an hour.

While a cold start is under way the queue term is capped at ``(running + waiting) / (maxNumSeqs *
targetUtilisation)``: the backlog will be admitted by the arriving replicas' batches, so counting it one replica
per ``targetQueuePerReplica`` only launched a second wave. With no fresh engine metrics the policy proposes the
current capacity, raised by the gateways' queue and rate terms when they are known (a pool at zero replicas
starts on its gateway queue): unknown load is never read as zero.

The envelope (carried in the proposal's state as ``(t, min(desired, max))``) follows demand up at once and down as an
exponential decay: capacity dropped after a peak takes a cold start to get back, so a burst shortly after a
drop must still find most of it. Measured with ``bench/autoscaling.py`` and ``bench/fleet_sim.py``: without it
the pool fell to ``ceil(raw)`` within minutes of a drop and the next burst queued for a whole cold start
(more seconds over the TTFT SLO than the ``threshold`` baseline). With tau = 6 cold starts the default holds
the SLO at least as well as the baseline on 20-30% fewer replica-hours when a burst returns within about five
cold starts of a drop; a 4x burst after a longer quiet still finds only the 1/targetUtilisation headroom (the
baseline keeps 4x: it only shrinks below a quarter of its slots busy). Longer tau buys robustness with
replica-hours; ``releaseTimeConstantS: 0`` turns the envelope off.

Parameters (``autoscaling.policy.params``): ``targetQueuePerReplica`` (> 0), ``targetKvUsage`` and
``targetUtilisation`` (in (0, 1]) override the stack-wide targets; ``releaseTimeConstantS`` (>= 0) the release
time constant; ``sustainWindowS`` (>= 0, default as above; 0: this tick only) and ``sustainQuantile``
(in [0, 1], default 0.5) the queue depth and request rate the queue and capacity terms read.

    autoscaling:
      policy: {name: target-tracking, params: {releaseTimeConstantS: 900, sustainQuantile: 0.5}}
"""

from __future__ import annotations

import math

from pydantic import Field

from control_plane.scaling.context import ScalingContext
from control_plane.scaling.policies import Proposal, ScalingPolicy
from fleet.protocol.wire import RATE_WINDOW_S
from fleet.spec.plugins import PluginParams

__all__ = ["RELEASE_COLD_STARTS", "TargetTracking", "capacity_replicas", "rate_window", "sustained"]

RELEASE_COLD_STARTS = 6.0  # default release time constant, in cold starts

Samples = list[tuple[float, float]]


def sustained(
    ctx: ScalingContext, key: str, value: float | None, window_s: float, q: float
) -> tuple[float | None, Samples]:
    """The ``q`` quantile (nearest rank) of a term's values over the last ``window_s``, this tick's ``value``
    included, and the samples to carry in the state under ``key``; None when the value is unknown now.

    Past samples come from ``ctx.state[key]`` (``[t, value]`` pairs, as the last tick returned them). A tick with
    the value unknown keeps the window but answers None: an unknown value is never read from old samples."""
    samples: Samples = [(float(t), float(v)) for t, v in ctx.state.get(key, ()) if ctx.now - t < window_s]
    if value is None:
        return None, samples
    samples.append((ctx.now, value))
    values = sorted(v for _, v in samples)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))], samples


def rate_window(cold_start_s: float) -> float:
    """The default window of the rate term: a cold start less the gateways' own rate window, at least half a
    cold start. The reported rate is already a mean over `RATE_WINDOW_S`, so a step reaches the scaler spread
    over that long; the median over a whole cold start on top of it ordered a step's capacity only after more
    than a cold start (16 s on the local stack's 15 s). With this window a step is ordered within
    ``RATE_WINDOW_S + window / 2``, under a cold start whenever the cold start is at least 14 s; a ten-second
    burst, ``RATE_WINDOW_S`` of a raised mean, still moves no median of a window longer than twice that."""
    return max(cold_start_s - RATE_WINDOW_S, cold_start_s / 2)


def capacity_replicas(ctx: ScalingContext, target_u: float, rate: float | None = None) -> float | None:
    """Replicas ``rate`` (default: the gateways' last report) needs at ``target_u`` of the planned per-replica
    QPS; None when the rate is unknown (no fresh gateway report) or the pool has no plan."""
    rate = ctx.request_rate if rate is None else rate
    if rate is None or not ctx.per_replica_qps or ctx.per_replica_qps <= 0 or target_u <= 0:
        return None
    return rate / (ctx.per_replica_qps * target_u)


def _without_engine_metrics(
    ctx: ScalingContext, rate: float | None, target_q: float, carry: dict[str, Samples]
) -> Proposal:
    """With no fresh engine metrics: the current capacity, raised by the gateways' queue and rate terms when they
    are known (unknown load is never read as zero)."""
    hold = float(ctx.capacity)
    gateway = max(rate or 0.0, (ctx.gateway_waiting or 0.0) / target_q)
    if gateway > hold:
        reason = f"no fresh engine metrics; the gateways' queue and request rate need {gateway:.2f} replicas"
        return Proposal(gateway, reason, {"gateway_replicas": round(gateway, 3)}, carry)
    return Proposal(hold, "no fresh load metrics: holding capacity (unknown is not zero)", state=carry)


def _decayed_envelope(ctx: ScalingContext, tau: float) -> float | None:
    """The last tick's envelope decayed to now with time constant ``tau``; None when off or there is none."""
    last = ctx.state.get("envelope")
    if tau <= 0 or last is None:
        return None
    return float(last[1]) * math.exp(-max(0.0, ctx.now - float(last[0])) / tau)


class TargetTracking(ScalingPolicy, name="target-tracking"):
    class Params(PluginParams):
        target_queue_per_replica: float | None = Field(default=None, gt=0.0)
        """Overrides autoscaling.targetQueuePerReplica."""
        target_kv_usage: float | None = Field(default=None, gt=0.0, le=1.0)
        """Overrides autoscaling.targetKvUsage."""
        target_utilisation: float | None = Field(default=None, gt=0.0, le=1.0)
        """Overrides autoscaling.targetUtilisation."""
        release_time_constant_s: float | None = Field(default=None, ge=0.0)
        """Release time constant of the envelope (default 6 cold starts; 0 turns the envelope off)."""
        sustain_window_s: float | None = Field(default=None, ge=0.0)
        """How far back the queue and capacity terms read (default: one cold start for the queue, a cold start
        less the gateways' 10 s rate window, at least half a cold start, for the rate; 0: this tick only)."""
        sustain_quantile: float = Field(default=0.5, ge=0.0, le=1.0)
        """Which quantile of the queue depths and request rates seen in that window they read (1: the peak)."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or self.Params()

    def propose(self, ctx: ScalingContext) -> Proposal:
        p = self.params
        target_q = p.target_queue_per_replica or ctx.target_queue_per_replica
        target_kv = p.target_kv_usage or ctx.target_kv_usage
        target_u = p.target_utilisation or ctx.target_utilisation
        window = ctx.cold_start_s if p.sustain_window_s is None else p.sustain_window_s
        rate_window_s = rate_window(ctx.cold_start_s) if p.sustain_window_s is None else p.sustain_window_s
        sustained_rate, rates = sustained(ctx, "rates", ctx.request_rate, rate_window_s, p.sustain_quantile)
        sustained_queue, queues = sustained(
            ctx, "queues", ctx.queue_depth if ctx.has_metrics else None, window, p.sustain_quantile
        )
        carry = {"rates": rates, "queues": queues}
        rate = capacity_replicas(ctx, target_u, sustained_rate)
        if not ctx.has_metrics:
            return _without_engine_metrics(ctx, rate, target_q, carry)
        queue = (sustained_queue or 0.0) / target_q
        if ctx.arriving and ctx.queue_depth > 0:
            # A cold start is under way: the backlog will be taken by the arriving replicas' batches, so it
            # needs replicas by batch slots, not one per targetQueuePerReplica (which launched a second wave).
            queue = min(queue, ctx.demand / (ctx.max_num_seqs * target_u))
        terms = {
            "queue": queue,
            "kv": ctx.kv_usage_total / target_kv,
            "utilisation": ctx.running / (ctx.max_num_seqs * target_u),
        }
        if rate is not None:
            terms["capacity"] = rate
        signal = max(terms, key=lambda k: terms[k])
        desired = terms[signal]
        inputs = {f"{k}_replicas": round(v, 3) for k, v in terms.items()}
        reason = (
            f"{signal} needs {desired:.2f} replicas "
            f"(queue {sustained_queue or 0.0:g} over {window:g}s (now {ctx.queue_depth:g}) / target {target_q:g} "
            "per replica, "
            f"KV {ctx.kv_usage_total:.2f} / {target_kv:g}, running {ctx.running:g} / "
            f"{ctx.max_num_seqs}x{target_u:g}"
        )
        if rate is not None:
            reason += f", {sustained_rate:.1f} req/s over {rate_window_s:g}s (now {ctx.request_rate:.1f}) / "
            reason += f"{ctx.per_replica_qps:.1f}x{target_u:g}"
            inputs["sustained_rate"] = round(sustained_rate or 0.0, 3)
        reason += ")"
        tau = p.release_time_constant_s
        if tau is None:
            tau = RELEASE_COLD_STARTS * ctx.cold_start_s
        envelope, decayed = desired, _decayed_envelope(ctx, tau)
        if decayed is not None and decayed > desired:
            envelope = decayed
            inputs["envelope_replicas"] = round(decayed, 3)
            reason = f"envelope: releasing capacity over {tau:g}s holds {decayed:.2f}; {reason}"
        # Remember at most what the pool may run: a queue spike asking for 200 replicas of a 24-replica pool
        # must not hold the maximum for ln(200 / 24) time constants.
        remembered = min(envelope, float(ctx.max_replicas))
        return Proposal(envelope, reason, inputs, {"envelope": (ctx.now, remembered), **carry}, live=desired)
