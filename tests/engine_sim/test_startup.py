"""The simulated start's split into vLLM's load, compile and graph phases, and a stop in the middle of one."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from agent.engine_log import PhaseMark, StartPhase, parse_line
from engine_sim.platform import CPU
from engine_sim.startup import COMPILE_S, GRAPHS_S, LOAD_BYTES_S, StartupPhases, run_startup
from fleet.capacity.plan import weight_bytes
from tests.engine_sim.builders import make_config

log = logging.getLogger("tests.engine_sim.startup")


@pytest.mark.parametrize(("startup_s", "tensor_parallel_size"), [(2.0, 1), (0.5, 1), (120.0, 2), (0.0, 1)], ids=str)
def test_the_phases_sum_to_the_startup_in_the_nominal_proportions(startup_s: float, tensor_parallel_size: int) -> None:
    config = make_config(tensor_parallel_size=tensor_parallel_size)
    phases = StartupPhases.split(startup_s, config)
    assert phases.load_s + phases.compile_s + phases.graphs_s == pytest.approx(startup_s)
    if startup_s > 0:
        load_nominal = weight_bytes(config.facts) / tensor_parallel_size / LOAD_BYTES_S
        assert phases.load_s / phases.graphs_s == pytest.approx(load_nominal / GRAPHS_S)
        assert phases.compile_s / phases.graphs_s == pytest.approx(COMPILE_S / GRAPHS_S)


def test_the_default_model_loads_for_a_sixth_of_a_two_second_start() -> None:
    phases = StartupPhases.split(2.0, make_config())  # Qwen2.5-7B: 7.6 s of 42 s nominal
    assert (round(phases.load_s, 2), round(phases.compile_s, 2), round(phases.graphs_s, 2)) == (0.36, 0.92, 0.71)


async def test_a_stop_during_a_phase_ends_the_start_at_once() -> None:
    stop = asyncio.Event()
    phases = StartupPhases(load_s=0.05, compile_s=30.0, graphs_s=30.0, weight_gib=1.0)
    asyncio.get_running_loop().call_later(0.2, stop.set)
    began = time.monotonic()
    assert await run_startup(phases, stop, log) is True
    assert time.monotonic() - began < 5.0


async def test_an_uninterrupted_start_runs_every_phase() -> None:
    phases = StartupPhases(load_s=0.05, compile_s=0.05, graphs_s=0.05, weight_gib=1.0)
    began = time.monotonic()
    assert await run_startup(phases, asyncio.Event(), log) is False
    assert time.monotonic() - began >= 0.14  # three phases of 0.05 s (timers may fire a tick early)


async def test_the_cpu_build_starts_without_graphs_and_logs_its_warm_up_from_the_engine_core(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = make_config(gpu_profile="cpu-tiny")
    phases = StartupPhases.split(0.2, config)
    assert phases.graphs_s == 0.0 and phases.load_s + phases.compile_s == pytest.approx(0.2)
    with caplog.at_level(logging.INFO, logger=log.name):
        assert await run_startup(phases, asyncio.Event(), log, CPU) is False
    lines = [r.getMessage() for r in caplog.records]
    assert all(line.startswith("(EngineCore_DP0 pid=") for line in lines)
    said = "\n".join(lines)
    assert "Warming up model for the compilation..." in said and "Warming up done." in said
    assert "Graph capturing" not in said and "(compilation:" not in said
    # The agent reads the CPU build's start from these lines as it does from vLLM's (agent.engine_log).
    parsed = [parse_line(line) for line in lines]
    assert any(isinstance(p, PhaseMark) and p.phase is StartPhase.COMPILE for p in parsed)
