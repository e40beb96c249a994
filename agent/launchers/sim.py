"""Simulator launcher: ``llmfleet sim serve MODEL ...`` with ``vllm serve``'s flags plus the pool's sim settings.

Runs through the same launch path as vLLM (own process group, log file, SIGTERM drain), so every agent
behaviour is exercised without a GPU. Simulator-only flags come from ``engine.sim``; fault flags for tests
(``--fault-crash-after-requests N``, ``--fault-hang``) are passed as extra arguments.

MODEL is the pool's model id, or the local directory the agent fetched from the model store; a directory is not
a catalogue name, so the pool's model facts (`fleet.capacity.plan.model_facts`) go along as ``--model-facts``.

Example pool (``engine.kind: sim``)::

    engine: {kind: sim, sim: {gpuProfile: a100-80gb, timeScale: 10, startupSeconds: 1}}
"""

from __future__ import annotations

import dataclasses
import json
import sys

from agent.launchers.base import Launcher, _num
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
        if self.config.model_dir is not None:
            flags += ["--model-facts", json.dumps(dataclasses.asdict(model_facts(self.pool)))]
        head = [sys.executable, "-m", "llmfleet.cli", "sim", "serve", self.model]
        return [*head, *self.common_flags(), *flags, *self.extra_flags()]
