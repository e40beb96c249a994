"""The agent's wiring: the engine's device, found once from the node's GPUs, in the launcher and in /status; the
engine's release against the pool's pin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest

from agent.node import Agent, AgentOptions
from agent.states import Event
from tests.agent.builders import VirtualClock
from tests.support.stacks import pool

A100 = {"index": "0", "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1111", "memory.total": "81920"}


def _gpus(*gpus: dict[str, str]) -> Callable[[], Awaitable[list[dict[str, str]]]]:
    async def query() -> list[dict[str, str]]:
        return list(gpus)

    return query


def _agent(http: httpx.AsyncClient, kind: str, *gpus: dict[str, str]) -> Agent:
    options = AgentOptions(replica="r0", port=1, engine_port=2, control_plane=None)
    spec = pool(**{"engine.kind": kind, "engine.sleepMode": True})
    return Agent(spec, options, http, VirtualClock(), gpu_query=_gpus(*gpus))


@pytest.mark.parametrize(
    ("case", "kind", "gpus", "device", "dropped"),
    [
        ("vLLM, no GPU", "vllm", (), "cpu", ["--gpu-memory-utilization", "--enable-sleep-mode"]),
        ("vLLM on a GPU", "vllm", (A100,), "gpu", []),
        ("simulator, no GPU: unaffected", "sim", (), "cpu", []),
    ],
)
async def test_the_device_found_at_start_decides_the_engine_flags_and_shows_in_status(
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    kind: str,
    gpus: tuple[dict[str, str], ...],
    device: str,
    dropped: list[str],
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    async with httpx.AsyncClient(trust_env=False) as http:
        agent = _agent(http, kind, *gpus)
        await agent.find_device()
    engine = agent.status().engine
    assert (engine.device, engine.dropped_flags) == (device, dropped), case
    assert not set(dropped) & set(engine.argv) and set(dropped) <= set(agent.launcher.dropped_flags())
    kv_cache = agent.launcher.environment().get("VLLM_CPU_KVCACHE_SPACE")
    assert kv_cache == ("1" if dropped else None)
    assert [g["uuid"] for g in agent.status().gpus] == [g["uuid"] for g in gpus]


def _warmed(agent: Agent, version: str | None) -> None:
    """The supervisor read ``version`` off the engine's /version, then the warm-up passed."""
    agent.supervisor.engine_version = version
    agent.supervisor.machine.fire(Event.HEALTHY)
    agent.supervisor.machine.fire(Event.WARMED)


def _mismatch_gauge(agent: Agent) -> float | None:
    return agent.metrics.registry.get_sample_value("llmfleet_agent_engine_version_mismatch")


@pytest.mark.parametrize(
    ("case", "reported", "matches", "gauge"),
    [
        ("vLLM's CPU build, 0.32, against the pinned 0.33.0", "0.32.0", False, 1.0),
        ("the pinned release with a local label", "0.33.0+cpu", True, 0.0),
        ("no /version answer", None, None, 0.0),
    ],
)
async def test_the_engines_release_is_held_against_the_pools_pin_in_status_and_a_gauge(
    case: str, reported: str | None, matches: bool | None, gauge: float
) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        agent = _agent(http, "vllm", A100)
    assert agent.status().engine.version_matches is None and _mismatch_gauge(agent) == 0.0  # before any answer
    _warmed(agent, reported)
    engine = agent.status().engine
    assert (engine.version_pinned, engine.version_matches) == ("0.33.0", matches), case
    assert _mismatch_gauge(agent) == gauge
