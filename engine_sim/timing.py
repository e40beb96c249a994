"""Timing: seconds per scheduler step, from `fleet.perf.StepTimeModel` plus jitter, ageing and slowdown.

    seconds = StepTimeModel.step_seconds(tokens, decode_ctx, prefill_attn) * jitter * ageing * slowdown

* ``jitter``: a seeded log-normal factor with sigma ``jitter`` (0 disables it), mean-preserving.
* ``ageing``: throughput falls linearly with uptime by ``degradation_per_72h`` every 72 hours of model time
  (0.2 -> 20% fewer tokens/s after 72 h, i.e. steps 1.25x longer), capped at 90% loss. A restart resets it.
* ``slowdown``: a fault-injection factor (1 = none).

The caller passes uptime explicitly, so the same timer runs on a wall clock or a virtual one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from fleet.perf import StepTimeModel

__all__ = ["StepTimer", "StepWork"]

_SECONDS_PER_72H = 72 * 3600.0


@dataclass(frozen=True)
class StepWork:
    """What one step computes: token count and the two attention terms of `StepTimeModel`."""

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
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def ageing_factor(self, uptime_s: float) -> float:
        """Step-time multiplier after ``uptime_s`` seconds of model time."""
        loss = min(0.9, self.degradation_per_72h * max(0.0, uptime_s) / _SECONDS_PER_72H)
        return 1.0 / (1.0 - loss)

    def seconds(self, work: StepWork, uptime_s: float = 0.0) -> float:
        base = self.model.step_seconds(work.num_tokens, work.decode_context_tokens, work.prefill_attention_tokens2)
        factor = self.ageing_factor(uptime_s) * self.slowdown
        if self.jitter > 0:
            sigma = self.jitter
            factor *= math.exp(self._rng.gauss(-sigma * sigma / 2.0, sigma))
        return base * factor
