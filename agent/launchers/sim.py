"""Simulator launcher: ``llmfleet sim serve MODEL ...`` with ``vllm serve``'s flags plus the pool's sim settings.

Runs through the same launch path as vLLM (own process group, log file, SIGTERM drain), so every agent
behaviour is exercised without a GPU. Simulator-only flags come from ``engine.sim``; fault flags for tests
(``--fault-crash-after-requests N``, ``--fault-hang``) are passed as extra arguments.

MODEL is the pool's model id, or the local directory the agent fetched from the model store; a directory is not
a catalogue name, so the pool's model facts (`fleet.capacity.plan.model_facts`) go along as ``--model-facts``, as
they do whenever the pool gives its own (``modelFacts``: a model outside the catalogue, such as a local folder).

A ``gpuProfile`` of `fleet.capacity.catalog.CPU_BUILD_GPUS` (``cpu-tiny``) makes the simulator play vLLM's CPU
build, which refuses ``--enable-sleep-mode`` and reads ``--gpu-memory-utilization`` as a share of host memory: the
agent leaves both out as it does for vLLM on a CPU (`agent.launchers.vllm`) and gives the KV cache
``engine.cpuKvCacheGib`` GiB as ``VLLM_CPU_KVCACHE_SPACE``, unless its own environment sets it. So the same pool
runs on the real CPU engine and on the simulator with the same flags.

A prefill or decode pool's simulated engine gets the ``--kv-transfer-config`` and the NIXL side channel's
environment vLLM's would (`agent.launchers.kv_transfer`), ``kv_buffer_device: cpu`` when its profile is a CPU build's.

Example pool (``engine.kind: sim``)::

    engine: {kind: sim, sim: {gpuProfile: a100-80gb, timeScale: 10, startupSeconds: 1}}
"""

from __future__ import annotations

import dataclasses
import json
import sys

from agent.launchers.base import CPU_KV_CACHE_ENV, Launcher, _num
from fleet.capacity.catalog import CPU_BUILD_GPUS
from fleet.capacity.plan import model_facts

__all__ = ["SimLauncher"]


class SimLauncher(Launcher, name="sim"):
    def argv(self) -> list[str]:
        sim = self.pool.engine.sim
        flags = [
            "--gpu-profile", sim.gpu_profile,
            "--time-scale", _num(sim.time_scale),
            "--startup-seconds", _num(sim.startup_seconds),
            "--jitter", _num(sim.jitter),
            "--degradation-per-72h", _num(sim.degradation_per_72h),
            "--seed", str(sim.seed),
        ]  # fmt: skip
        if self.config.model_dir is not None or self.pool.model_facts is not None:
            flags += ["--model-facts", json.dumps(dataclasses.asdict(model_facts(self.pool)))]
        head = [sys.executable, "-m", "llmfleet.cli", "sim", "serve", self.model]
        return [*head, *self.common_flags(), *flags, *self.extra_flags()]

    @property
    def on_cpu(self) -> bool:
        """The simulator plays the engine of its GPU profile: a CPU build's (``cpu-tiny``), wherever it runs."""
        return self.pool.engine.sim.gpu_profile in CPU_BUILD_GPUS

    def dropped_flags(self) -> dict[str, str]:
        if not self.on_cpu:
            return {}
        return self.cpu_dropped_flags("the simulated CPU build", f"{CPU_KV_CACHE_ENV} GiB instead")

    def environment(self) -> dict[str, str]:
        env = super().environment()
        return self.with_cpu_kv_cache(env) if self.on_cpu else env
