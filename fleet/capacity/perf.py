"""Perf: the engine step-time model shared by the capacity plan and the engine simulator.

One engine step processes N tokens (one per running decode plus this step's prefill chunks). Its time is

    step(N) = sqrt(floor^2 + (N * c)^2) + head + kv_read + prefill_attention + fixed

* ``floor`` = linear weight bytes / (eff_bw * HBM bandwidth): every step reads all weights once.
* ``c`` = 2 * linear params / (mfu * peak BF16 FLOP/s): the compute-bound cost per token.
* ``head`` = LM-head weight bytes / effective bandwidth (read once per step for the sampled rows).
* ``kv_read`` = sum of decode contexts * KV bytes per token / effective bandwidth.
* ``prefill_attention`` = 4 * hidden * sum(chunk * context) * layers / (mfu * peak).
* ``fixed`` = sampler, launch and CPU time not hidden by async scheduling.

Calibrated on Qwen2.5-7B / A100-80GB against published runs: batch-1 decode ~85 tok/s, batch-32 ~2.5k tok/s,
batch-256 ~8k tok/s, an idle 512-token prefill ~38 ms of engine time. Other GPUs scale by bandwidth and FLOPS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.capacity.catalog import DTYPE_BYTES, GPUS, GpuType, ModelFacts

__all__ = ["StepTimeModel", "kv_bytes_per_token"]

# Fractions of peak reached by real kernels (Vidur's A100 profile: 71% of HBM bandwidth on weight reads,
# ~63% of peak tensor FLOPS once compute-bound).
BANDWIDTH_EFFICIENCY = 0.71
COMPUTE_EFFICIENCY = 0.63
ATTENTION_EFFICIENCY = 0.5
FIXED_STEP_S = 0.0015


def kv_bytes_per_token(model: ModelFacts, kv_dtype: str = "auto") -> int:
    """KV cache bytes per token: 2 (K and V) x layers x KV heads x head dim x bytes per element."""
    dtype = model.dtype if kv_dtype == "auto" else kv_dtype
    return 2 * model.layers * model.kv_heads * model.head_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per engine step for one model on ``tensor_parallel`` GPUs of one type.

    Tensor parallelism divides weight reads and FLOPs across GPUs; an all-reduce cost per layer is added
    for TP > 1 (two per layer, ~20 us each on NVLink).
    """

    model: ModelFacts
    gpu: GpuType
    tensor_parallel: int = 1

    @classmethod
    def for_names(cls, model: ModelFacts, gpu: str, tensor_parallel: int = 1) -> StepTimeModel:
        return cls(model=model, gpu=GPUS[gpu], tensor_parallel=tensor_parallel)

    @property
    def _bandwidth(self) -> float:
        return self.gpu.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY * self.tensor_parallel

    @property
    def _flops(self) -> float:
        return self.gpu.bf16_flops * COMPUTE_EFFICIENCY * self.tensor_parallel

    @property
    def weight_floor_s(self) -> float:
        return self.model.linear_parameters * DTYPE_BYTES[self.model.dtype] / self._bandwidth

    @property
    def per_token_compute_s(self) -> float:
        return 2.0 * self.model.linear_parameters / self._flops

    @property
    def head_s(self) -> float:
        return self.model.head_parameters * DTYPE_BYTES[self.model.dtype] / self._bandwidth

    @property
    def fixed_s(self) -> float:
        allreduce = 0.0 if self.tensor_parallel == 1 else 2 * self.model.layers * 20e-6
        return FIXED_STEP_S + allreduce

    def step_seconds(
        self,
        num_tokens: int,
        decode_context_tokens: int = 0,
        prefill_attention_tokens2: float = 0.0,
    ) -> float:
        """Seconds for one step.

        ``num_tokens``: tokens computed this step (decodes + prefill chunk tokens); 0 means an idle step.
        ``decode_context_tokens``: sum over running decodes of their context length (KV read).
        ``prefill_attention_tokens2``: sum over prefill chunks of chunk_len * context_len_after_chunk.
        """
        if num_tokens <= 0:
            return 0.0
        linear = math.hypot(self.weight_floor_s, num_tokens * self.per_token_compute_s)
        kv = decode_context_tokens * kv_bytes_per_token(self.model) / self._bandwidth
        attn = (
            4.0
            * self.model.hidden_size
            * prefill_attention_tokens2
            * self.model.layers
            / (self.gpu.bf16_flops * ATTENTION_EFFICIENCY * self.tensor_parallel)
        )
        return linear + self.head_s + kv + attn + self.fixed_s

    def decode_tokens_per_s(self, batch: int, context: int) -> float:
        """Output tokens per second of the whole engine with ``batch`` decodes of ``context`` tokens each."""
        return batch / self.step_seconds(batch, decode_context_tokens=batch * context)

    def prefill_seconds(self, prompt_tokens: int, chunk: int = 8192) -> float:
        """Engine time to prefill one prompt on an otherwise idle engine."""
        remaining, done, total = prompt_tokens, 0, 0.0
        while remaining > 0:
            n = min(chunk, remaining)
            done += n
            total += self.step_seconds(n, prefill_attention_tokens2=float(n) * done)
            remaining -= n
        return total

    def max_tokens_per_step(self, step_budget_s: float, context: int = 0) -> int:
        """Largest N whose step (N decodes of ``context`` tokens each) fits in ``step_budget_s``; 0 if none."""
        lo, hi = 0, 1
        while self.step_seconds(hi, decode_context_tokens=hi * context) <= step_budget_s and hi < 1 << 20:
            hi *= 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.step_seconds(mid, decode_context_tokens=mid * context) <= step_budget_s:
                lo = mid
            else:
                hi = mid
        return lo
