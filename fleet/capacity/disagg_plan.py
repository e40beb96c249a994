"""Disaggregation plan: both roles sized from their targets, and whether splitting a pool pays, with its figures.

Sizing (`size_roles`), Dynamo's planner without its correction factors (../shared/research/pd_disaggregation.md,
section 2.2: prefill workers from prefill throughput at the TTFT target, decode workers from decode throughput at
the inter-token target):

* **prefill** replicas = ``required_replicas(remote rate, rho / S, buffer)``, ``S`` the idle prefill of the mean
  remote prompt (`fleet.capacity.perf.StepTimeModel.prefill_seconds`) and ``rho`` the utilisation at which an M/D/1
  queue's mean wait, ``rho S / (2 (1 - rho))``, is a quarter of the TTFT slack (target - S - the KV's wire time - a
  decode step): its tail runs a few means long. Between 0.3 (a slack near zero would otherwise ask for a replica
  per request) and 0.9, and 0.9 when the mean remote prompt misses the target even alone (then it misses it
  aggregated too: no queue is worth keeping short).
* **decode** replicas = the capacity plan's own rule (`fleet.capacity.plan.per_replica_qps` at the inter-token
  target) with the remote prompts' prefill taken off the decode replicas (as a cached fraction).
* **aggregated** replicas at the same targets = the larger of the plan's rule and the count that keeps prefill
  chunks out of 99% of decode steps: with chunked prefill a step that carries a chunk of ``c`` tokens lasts
  ``step(c + batch)``, and when more than 1% of steps carry one the inter-token p99 is that step
  (`aggregated_itl_p99`). That interference is what disaggregation removes; its price is the transfer and
  capacity split into two pools that cannot lend each other GPUs.

`verdict` compares the two counts: it pays when the split pools need fewer GPUs than the aggregated pool does
to meet both targets, and says "does not pay" with the reason otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.capacity.disagg import HANDSHAKE_S, KvLink, link_gbps, should_disaggregate
from fleet.capacity.perf import StepTimeModel, kv_bytes_per_token
from fleet.capacity.plan import (
    concurrency_that_fits,
    kv_budget_bytes,
    model_facts,
    output_tokens,
    per_replica_qps,
    pool_gpu,
    required_replicas,
    step_model,
)
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = [
    "Mix",
    "RoleSizing",
    "Verdict",
    "aggregated_itl_p99",
    "pool_link",
    "pool_verdict",
    "size_roles",
    "verdict",
]

P99_WAIT_FACTOR = 4.0  # an M/D/1 queue's p99 wait, in means, near the loads the cap allows (rough, on purpose)
MAX_PREFILL_UTILISATION = 0.9
MIN_PREFILL_UTILISATION = 0.3
TAIL_SHARE = 0.01  # a step share above this sets the p99


@dataclass(frozen=True)
class Mix:
    """A pool's traffic at peak, split by the decision: ``remote_share`` of requests prefill remotely (their mean
    uncached prompt ``remote_uncached``), the rest locally (``local_uncached``)."""

    peak_qps: float
    prompt_tokens: float
    output_tokens: float
    remote_share: float
    remote_uncached: float
    local_uncached: float
    buffer: float = 0.3

    @property
    def uncached(self) -> float:
        """Mean uncached prompt tokens over all requests."""
        return self.remote_share * self.remote_uncached + (1 - self.remote_share) * self.local_uncached


@dataclass(frozen=True)
class RoleSizing:
    prefill: int
    decode: int
    aggregated: int  # replicas an aggregated pool needs for both targets
    prefill_s: float  # idle prefill of the mean remote prompt
    transfer_s: float  # its KV's wire time
    prefill_utilisation: float  # the TTFT target's cap on a prefill replica's utilisation
    aggregated_itl_p99_s: float  # the aggregated pool's inter-token p99 at its plan's count
    decode_itl_s: float  # a decode replica's step at its batch: the split pool's inter-token latency
    notes: tuple[str, ...] = ()


def _decode_qps(steps: StepTimeModel, mix: Mix, itl_s: float, concurrency: int, local: float) -> float:
    """Requests/s a replica serves at ``itl_s`` when it prefills ``local`` tokens per request on average."""
    cached = 1.0 - min(1.0, local / mix.prompt_tokens) if mix.prompt_tokens > 0 else 0.0
    return per_replica_qps(
        steps, round(mix.prompt_tokens), round(mix.output_tokens), 1.0 / itl_s, concurrency, min(cached, 0.999)
    )


def aggregated_itl_p99(steps: StepTimeModel, mix: Mix, replicas: int, itl_s: float, chunk: int) -> tuple[float, float]:
    """(inter-token p99, share of decode steps carrying a prefill chunk) of an aggregated pool of ``replicas``."""
    rate = mix.peak_qps / max(1, replicas)
    batch = max(1, round(rate * mix.output_tokens * itl_s))  # Little's law at the target's step
    context = round(batch * (mix.prompt_tokens + mix.output_tokens / 2))
    decode_step = steps.step_seconds(batch, decode_context_tokens=context)
    long = mix.remote_uncached if mix.remote_share > 0 else mix.local_uncached
    chunks = math.ceil(long / chunk) if long > 0 else 0
    share = min(1.0, rate * chunks * decode_step)
    if share <= TAIL_SHARE or chunks == 0:
        return decode_step, share
    n = min(chunk, round(long))
    return steps.step_seconds(n + batch, decode_context_tokens=context, prefill_attention_tokens2=float(n) * n), share


def size_roles(
    steps: StepTimeModel,
    mix: Mix,
    ttft_s: float,
    itl_s: float,
    link: KvLink,
    kv_bytes_per_token: int,
    chunk: int,
    concurrency: int,
) -> RoleSizing:
    """Prefill replicas from the TTFT target, decode replicas from the inter-token target, and the aggregated pool's
    count for both targets (module docstring)."""
    notes: list[str] = []
    remote_rate = mix.peak_qps * mix.remote_share
    prefill_s = steps.prefill_seconds(round(mix.remote_uncached), chunk) if remote_rate > 0 else 0.0
    transfer_s = link.wire_seconds(mix.remote_uncached * kv_bytes_per_token) if remote_rate > 0 else 0.0
    slack = ttft_s - prefill_s - transfer_s - itl_s
    if remote_rate > 0 and slack <= 0:
        notes.append(
            f"the mean remote prompt's prefill ({prefill_s * 1000:.0f} ms) and KV transfer ({transfer_s * 1000:.0f} "
            f"ms) alone exceed the {ttft_s * 1000:.0f} ms TTFT target"
        )
    wait = slack / P99_WAIT_FACTOR
    # a target the mean remote prompt misses even alone (slack <= 0) is missed aggregated too: no queue to keep short
    rho = 2 * wait / (prefill_s + 2 * wait) if slack > 0 else MAX_PREFILL_UTILISATION
    rho = min(MAX_PREFILL_UTILISATION, max(MIN_PREFILL_UTILISATION, rho))
    prefill = required_replicas(remote_rate, rho / prefill_s, mix.buffer) if remote_rate > 0 else 0
    local = (1 - mix.remote_share) * mix.local_uncached
    qps = _decode_qps(steps, mix, itl_s, concurrency, local)
    decode = required_replicas(mix.peak_qps, qps, mix.buffer) if qps > 0 else 0
    agg_qps = _decode_qps(steps, mix, itl_s, concurrency, mix.uncached)
    agg_plan = required_replicas(mix.peak_qps, agg_qps, mix.buffer) if agg_qps > 0 else 0
    if qps <= 0 or agg_qps <= 0:
        notes.append(f"one replica cannot decode at {itl_s * 1000:.0f} ms a token even at batch 1")
    agg_p99, share = aggregated_itl_p99(steps, mix, agg_plan, itl_s, chunk)
    aggregated = agg_plan
    if agg_p99 > itl_s and share > TAIL_SHARE:  # enough replicas that chunks hit under 1% of steps
        aggregated = max(agg_plan, math.ceil(agg_plan * share / TAIL_SHARE))
    decode_batch = max(1, round(mix.peak_qps / max(1, decode) * mix.output_tokens * itl_s))
    ctx = round(decode_batch * (mix.prompt_tokens + mix.output_tokens / 2))
    decode_itl = steps.step_seconds(decode_batch, decode_context_tokens=ctx)
    return RoleSizing(prefill, decode, aggregated, prefill_s, transfer_s, rho, agg_p99, decode_itl, tuple(notes))


@dataclass(frozen=True)
class Verdict:
    pays: bool
    reasons: tuple[str, ...]


def verdict(sizing: RoleSizing, mix: Mix, itl_s: float, threshold: int) -> Verdict:
    """Whether splitting pays for ``mix`` at ``threshold`` and why, with the figures (module docstring)."""
    s = sizing
    split = s.prefill + s.decode
    figures = (
        f"aggregated: {s.aggregated} replicas meet both targets (inter-token p99 {s.aggregated_itl_p99_s * 1000:.0f} "
        f"ms at the plan's count against {itl_s * 1000:.0f} ms); disaggregated: {s.prefill} prefill + {s.decode} "
        f"decode = {split} (decode step {s.decode_itl_s * 1000:.0f} ms; mean remote prefill "
        f"{s.prefill_s * 1000:.0f} ms + KV transfer {s.transfer_s * 1000:.1f} ms)"
    )
    if mix.remote_share <= 0:
        why = (
            f"does not pay: no prompt's uncached tokens ({mix.local_uncached:.0f} on average) exceed the "
            f"{threshold}-token threshold, so prefill replicas would sit idle and every request stays aggregated"
        )
        return Verdict(False, (why, *s.notes))
    if split < s.aggregated:
        why = (
            f"pays: {split} replicas split meet both targets where aggregated needs {s.aggregated}: prefill chunks of "
            f"{mix.remote_uncached:.0f}-token prompts stall decode steps, which only spare replicas hide"
        )
        return Verdict(True, (why, figures, *s.notes))
    reason = (
        "the aggregated pool already meets the inter-token target (prefill chunks are short or rare)"
        if s.aggregated_itl_p99_s <= itl_s
        else "the interference it removes costs fewer replicas than the split's two pools"
    )
    why = f"does not pay: {reason}; the split needs {split} replicas against {s.aggregated}"
    return Verdict(False, (why, figures, *s.notes))


def pool_link(spec: FleetSpec, pool: PoolSpec, gbps: float | None = None, handshake_s: float = HANDSHAKE_S) -> KvLink:
    """A prefill replica's link in ``pool``: ``gbps`` when given, else its share of its node group's EFA."""
    instance = None if pool.node_group is None else spec.node_group(pool.node_group).instance_type
    rate = gbps if gbps is not None else link_gbps(instance, pool.engine.tensor_parallel_size)
    return KvLink(rate, handshake_s)


def pool_verdict(spec: FleetSpec, pool: PoolSpec, threshold: int) -> tuple[RoleSizing, Verdict]:
    """`size_roles` and `verdict` for ``pool``'s declared workload: every prompt at its mean, less its cached
    fraction (one mean cannot show a spread of lengths: ``llmfleet simulate --compare pd`` measures a trace's)."""
    work = pool.workload
    uncached = work.mean_prompt_tokens * (1.0 - work.cached_prompt_fraction)
    sizing, found = _verdict_at(spec, pool, uncached, threshold)
    if sizing.prefill == 0 and threshold > 0:  # what splitting would cost were every prompt sent to prefill
        _, every = _verdict_at(spec, pool, uncached, 0)
        figures = [f"the figures then: {r}" for r in every.reasons[1:2]]
        found = Verdict(
            found.pays, (*found.reasons, f"with every prompt prefilled remotely: {every.reasons[0]}", *figures)
        )
    return sizing, found


def _verdict_at(spec: FleetSpec, pool: PoolSpec, uncached: float, threshold: int) -> tuple[RoleSizing, Verdict]:
    work, engine = pool.workload, pool.engine
    remote = should_disaggregate(round(uncached), threshold)
    mix = Mix(
        peak_qps=work.peak_qps,
        prompt_tokens=work.mean_prompt_tokens,
        output_tokens=output_tokens(pool),
        remote_share=1.0 if remote else 0.0,
        remote_uncached=uncached if remote else 0.0,
        local_uncached=0.0 if remote else uncached,
        buffer=work.capacity_buffer,
    )
    facts = model_facts(pool)
    budget = kv_budget_bytes(pool_gpu(spec, pool), facts, engine.tensor_parallel_size, engine.gpu_memory_utilization)
    kv_tokens = max(0, int(budget // kv_bytes_per_token(facts)))
    concurrency = concurrency_that_fits(kv_tokens, work.mean_prompt_tokens + output_tokens(pool), engine.max_num_seqs)
    itl_s = 1.0 / pool.slo.decode_tokens_per_s_p99
    sizing = size_roles(
        step_model(spec, pool),
        mix,
        pool.slo.ttft_p99_ms / 1000.0,
        itl_s,
        pool_link(spec, pool),
        kv_bytes_per_token(facts),
        engine.max_num_batched_tokens,
        max(1, concurrency),
    )
    return sizing, verdict(sizing, mix, itl_s, threshold)
