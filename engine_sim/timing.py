"""Timing: seconds per scheduler step, from `fleet.capacity.perf.StepTimeModel` plus jitter, ageing and slowdown.

    seconds = StepTimeModel.step_seconds(tokens, decode_ctx, prefill_attn) * jitter * ageing * slowdown

On vLLM's CPU build (``cpu``: `engine_sim.platform.CpuStepCosts`) the base is the measured per-step costs instead,
``hypot(fixed, per_sequence * seqs) + per_token * tokens + per_attention * prefill_attn (+ prefill)``: the caller
passes the step's sequence count.

* ``jitter``: a seeded log-normal factor with sigma ``jitter`` (0 disables it), mean-preserving.
* ``ageing``: throughput falls linearly with uptime by ``degradation_per_72h`` every 72 hours of model time
  (0.2 -> 20% fewer tokens/s after 72 h, i.e. steps 1.25x longer), capped at 90% loss. A restart resets it.
* ``slowdown``: a fault-injection factor (1 = none).

The caller passes uptime explicitly, so the same timer runs on a wall clock or a virtual one. The base is
`StepTimeModel.step_seconds` with its constants read once (a step is timed every few milliseconds of model time,
and the model recomputes them from the model's facts on each call): same terms, same order, the same float.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import NamedTuple

from engine_sim.platform import CpuStepCosts
from fleet.capacity.perf import ATTENTION_EFFICIENCY, BANDWIDTH_EFFICIENCY, StepTimeModel, kv_bytes_per_token

__all__ = ["StepTimer", "StepWork"]

_SECONDS_PER_72H = 72 * 3600.0


class StepWork(NamedTuple):
    """What one step computes: token count and the two attention terms of `StepTimeModel` (a named tuple: one is
    built per step)."""

    num_tokens: int
    decode_context_tokens: int = 0
    prefill_attention_tokens2: float = 0.0


@dataclass
class StepTimer:
    model: StepTimeModel
    jitter: float = 0.0
    degradation_per_72h: float = 0.0
    slowdown: float = 1.0
    seed: int = 0
    cpu: CpuStepCosts | None = None  # the CPU build's costs replace the roofline
    _rng: random.Random = field(init=False, repr=False)
    _base: _BaseStepSeconds = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._base = _BaseStepSeconds(self.model)

    def base_seconds(self, work: StepWork, num_seqs: int = 1) -> float:
        """``model.step_seconds`` for ``work`` (the CPU costs' for ``num_seqs`` sequences): no jitter, ageing or
        slowdown."""
        if self.cpu is not None:
            return self.cpu.step_seconds(work.num_tokens, num_seqs, work.prefill_attention_tokens2)
        return self._base(work.num_tokens, work.decode_context_tokens, work.prefill_attention_tokens2)

    def ageing_factor(self, uptime_s: float) -> float:
        """Step-time multiplier after ``uptime_s`` seconds of model time."""
        loss = min(0.9, self.degradation_per_72h * max(0.0, uptime_s) / _SECONDS_PER_72H)
        return 1.0 / (1.0 - loss)

    def seconds(self, work: StepWork, uptime_s: float = 0.0, num_seqs: int = 1) -> float:
        """The step's seconds; ``num_seqs`` (the requests it runs) counts only on the CPU build."""
        if self.cpu is not None:
            base = self.cpu.step_seconds(work.num_tokens, num_seqs, work.prefill_attention_tokens2)
        else:
            base = self._base(work.num_tokens, work.decode_context_tokens, work.prefill_attention_tokens2)
        # Without degradation the ageing factor is exactly 1.0: skip computing it.
        factor = self.slowdown if self.degradation_per_72h == 0 else self.ageing_factor(uptime_s) * self.slowdown
        if self.jitter > 0:
            sigma = self.jitter
            factor *= math.exp(self._rng.gauss(-sigma * sigma / 2.0, sigma))
        return base * factor


class _BaseStepSeconds:
    """`StepTimeModel.step_seconds` with the model's constants computed once and ``linear + head`` kept per token
    count (a handful of distinct counts recur: the batch sizes). Each operation is the model's, in its order, so
    results are bit-identical; a test holds the two together."""

    def __init__(self, model: StepTimeModel) -> None:
        self._floor = model.weight_floor_s
        self._per_token = model.per_token_compute_s
        self._head = model.head_s
        self._fixed = model.fixed_s
        self._kv_bytes = kv_bytes_per_token(model.model)
        self._bandwidth = model.gpu.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY * model.tensor_parallel
        self._attn_hidden = 4.0 * model.model.hidden_size
        self._layers = model.model.layers
        self._attn_flops = model.gpu.bf16_flops * ATTENTION_EFFICIENCY * model.tensor_parallel
        self._linear_head: dict[int, float] = {}

    def __call__(self, num_tokens: int, decode_context_tokens: int, prefill_attention_tokens2: float) -> float:
        if num_tokens <= 0:
            return 0.0
        linear_head = self._linear_head.get(num_tokens)
        if linear_head is None:
            linear = math.hypot(self._floor, num_tokens * self._per_token)
            linear_head = self._linear_head[num_tokens] = linear + self._head
        kv = decode_context_tokens * self._kv_bytes / self._bandwidth
        attn = self._attn_hidden * prefill_attention_tokens2 * self._layers / self._attn_flops
        return linear_head + kv + attn + self._fixed
