"""The fetching state: the supervisor fetches before the first spawn, backs off on failures, and the launchers
load the fetched directory under the pool's served name (virtual clock, scripted fetches, no processes)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from agent.control import ControlClient
from agent.launchers import LaunchConfig, make_launcher
from agent.metrics import AgentMetrics
from agent.model_store import FetchError
from agent.restarts import RestartPolicy
from agent.states import Event, State
from agent.supervisor import Supervisor, SupervisorSettings
from tests.agent.builders import FakeWorld, VirtualClock
from tests.support import stacks

SETTINGS = SupervisorSettings(
    probe_interval_s=1.0,
    restart=RestartPolicy(max_restarts=2, window_s=300.0, backoff_base_s=1.0, backoff_max_s=8.0, jitter=0.0),
)
MODEL_DIR = "/models/store/Qwen/Qwen2.5-7B-Instruct/main"


@dataclass
class ScriptedFetch:
    """Fails with the next scripted error, if any; then succeeds. ``gate`` holds a fetch until it is set."""

    failures: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None
    calls: int = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            raise FetchError(self.failures.pop(0))


@dataclass
class Run:
    supervisor: Supervisor
    world: FakeWorld
    fetch: ScriptedFetch
    metrics: AgentMetrics

    async def until(self, predicate: Callable[[], bool]) -> None:
        for _ in range(20_000):
            if predicate():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"condition not reached; state={self.supervisor.state}")

    def events(self) -> list[Event]:
        return [t.event for t in self.supervisor.machine.history]


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Run]]:
    tasks: list[asyncio.Task[int]] = []

    def build(fetch: ScriptedFetch, settings: SupervisorSettings = SETTINGS) -> Run:
        clock = VirtualClock()
        world = FakeWorld(clock, startup_s=1.0)
        http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(202)))
        pool = stacks.pool()
        metrics = AgentMetrics("r0", pool.name, State.FETCHING)
        supervisor = Supervisor(
            pool, "r0", world.spawn, world, ControlClient(http, None), clock, metrics, settings,
            rand=lambda: 0.5, fetch=fetch,
        )  # fmt: skip
        tasks.append(asyncio.ensure_future(supervisor.run()))
        return Run(supervisor, world, fetch, metrics)

    yield build
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_engine_is_spawned_only_after_the_fetch_succeeded(start: Callable[..., Run]) -> None:
    gate = asyncio.Event()
    run = start(ScriptedFetch(gate=gate))
    await run.until(lambda: run.fetch.calls == 1)
    assert run.supervisor.state is State.FETCHING and run.world.engines == []
    assert run.metrics.registry.get_sample_value("llmfleet_agent_state", {"state": "fetching"}) == 1.0
    gate.set()
    await run.until(lambda: run.supervisor.state is State.READY)
    assert run.events() == [Event.FETCHED, Event.HEALTHY, Event.WARMED]


async def test_a_failed_fetch_backs_off_and_fetches_again(start: Callable[..., Run]) -> None:
    run = start(ScriptedFetch(failures=["config.json: sha256 does not match"]))
    await run.until(lambda: run.supervisor.state is State.READY)
    assert run.events()[:3] == [Event.FETCH_FAILED, Event.REFETCH, Event.FETCHED]
    assert run.fetch.calls == 2 and len(run.world.engines) == 1
    assert run.supervisor.last_error == "model fetch failed: config.json: sha256 does not match"
    assert run.supervisor.restarts == 0  # no engine was restarted


async def test_repeated_fetch_failures_end_in_failed_with_the_reason(start: Callable[..., Run]) -> None:
    run = start(ScriptedFetch(failures=["a", "b", "tokenizer.json: sha256 does not match"]))
    await run.until(lambda: run.supervisor.state is State.FAILED)
    assert run.fetch.calls == 3 and run.world.engines == []
    assert run.supervisor.last_error == "model fetch failed: tokenizer.json: sha256 does not match"


async def test_an_engine_crash_after_a_fetch_respawns_without_fetching_again(start: Callable[..., Run]) -> None:
    run = start(ScriptedFetch())
    await run.until(lambda: run.supervisor.state is State.READY)
    assert run.world.engine is not None
    run.world.engine.exit(1)
    await run.until(lambda: len(run.world.engines) == 2 and run.supervisor.state is State.READY)
    assert run.fetch.calls == 1 and Event.RESPAWN in run.events() and Event.REFETCH not in run.events()


async def test_a_drain_during_the_fetch_stops_without_an_engine(start: Callable[..., Run]) -> None:
    run = start(ScriptedFetch(gate=asyncio.Event()))
    await run.until(lambda: run.fetch.calls == 1)
    assert run.supervisor.request_drain()
    await run.until(lambda: run.supervisor.state is State.STOPPED)
    assert run.events() == [Event.DRAIN, Event.DRAINED] and run.world.engines == []


# ---- launchers with a fetched directory -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_launchers_load_the_fetched_directory_under_the_pools_served_name(kind: str) -> None:
    pool = stacks.pool(**{"engine.kind": kind})
    argv = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, model_dir=MODEL_DIR)).argv()
    assert argv[argv.index("serve") + 1] == MODEL_DIR
    assert argv[argv.index("--served-model-name") + 1] == pool.served_name == stacks.MODEL
    assert "--revision" not in argv


def test_the_simulator_gets_the_pools_model_facts_with_a_directory() -> None:
    pool = stacks.pool()
    argv = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, model_dir=MODEL_DIR)).argv()
    assert argv[:6] == [sys.executable, "-m", "llmfleet.cli", "sim", "serve", MODEL_DIR]
    facts = json.loads(argv[argv.index("--model-facts") + 1])
    assert facts["layers"] == 28 and facts["kv_heads"] == 4  # Qwen2.5-7B from the catalogue
    plain = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1)).argv()
    assert "--model-facts" not in plain and plain[5] == pool.model


@pytest.mark.parametrize(("revision", "model_dir", "expected"), [
    ("abc123", None, ["--revision", "abc123"]),  # from the Hub, pinned
    ("main", None, []),  # from the Hub, its default
    ("abc123", MODEL_DIR, []),  # the directory is that revision already
])  # fmt: skip
def test_vllm_pins_the_hub_revision_only_when_loading_from_the_hub(
    revision: str, model_dir: str | None, expected: list[str]
) -> None:
    pool = stacks.pool(**{"engine.kind": "vllm", "modelRevision": revision})
    argv = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, model_dir=model_dir)).argv()
    pinned = argv[argv.index("--revision") : argv.index("--revision") + 2] if "--revision" in argv else []
    assert pinned == expected
