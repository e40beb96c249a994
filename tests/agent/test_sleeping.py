"""Sleep mode in the supervisor, under a virtual clock and a scripted engine: leave routing, sleep, wake, check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agent.control import ControlClient
from agent.metrics import AgentMetrics
from agent.states import Event, State
from agent.supervisor import Supervisor
from tests.agent.builders import FakeWorld, VirtualClock
from tests.agent.test_supervisor import SETTINGS, Harness, LeaseDesk
from tests.support import stacks

SLEEPY = {"engine.sleepMode": True, "drain.propagationSeconds": 4.0}


@dataclass
class SleepHarness(Harness):
    metrics: AgentMetrics | None = None

    def restarts(self, reason: str) -> float | None:
        assert self.metrics is not None
        labels = {"reason": reason}
        return self.metrics.registry.get_sample_value("llmfleet_agent_engine_restarts_total", labels)


Build = Callable[..., SleepHarness]


@pytest.fixture
async def build() -> AsyncIterator[Build]:
    tasks: list[asyncio.Task[int]] = []

    def make(pool_overrides: dict[str, Any] | None = None, **world_kw: Any) -> SleepHarness:
        clock = VirtualClock()
        world = FakeWorld(clock, startup_s=1.0, **world_kw)
        desk = LeaseDesk()
        control = ControlClient(httpx.AsyncClient(transport=httpx.MockTransport(desk.handler)), "http://cp")
        pool = stacks.pool(**(SLEEPY if pool_overrides is None else pool_overrides))
        metrics = AgentMetrics("r0", pool.name)
        supervisor = Supervisor(pool, "r0", world.spawn, world, control, clock, metrics, SETTINGS, rand=lambda: 0.5)
        tasks.append(asyncio.ensure_future(supervisor.run()))
        return SleepHarness(supervisor, world, clock, desk, tasks[-1], metrics)

    yield make
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_sleep_drops_readiness_at_once_and_sleeps_after_the_propagation_delay(build: Build) -> None:
    h = build()
    await h.until_state(State.READY)
    asked = h.clock.now
    assert h.supervisor.request_sleep()
    assert h.supervisor.state is State.SLEEPING and not h.supervisor.machine.ready
    await h.until(lambda: h.supervisor.sleep.asleep)
    assert h.clock.now - asked >= 4.0  # gateways had the propagation delay to stop routing here
    assert h.world.sleeps == 1 and h.supervisor.sleep.reference is not None


async def test_a_wake_checks_the_engine_and_returns_to_ready_on_the_same_engine(build: Build) -> None:
    h = build()
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    await h.until(lambda: h.supervisor.sleep.asleep)
    assert h.supervisor.request_wake()
    await h.until_state(State.READY)
    assert h.events()[-3:] == [Event.SLEEP, Event.WAKE, Event.WOKEN]
    assert len(h.world.engines) == 1 and h.world.wakes == 1
    assert h.supervisor.sleep.woken_with == h.supervisor.sleep.reference


async def test_a_wake_whose_check_differs_restarts_the_engine_cold(build: Build) -> None:
    h = build(wake_changes_tokens=True)
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    await h.until(lambda: h.supervisor.sleep.asleep)
    h.supervisor.request_wake()
    await h.until(lambda: len(h.world.engines) == 2 and h.supervisor.state is State.READY)
    assert Event.WAKE_FAILED in h.events() and h.world.engines[0].killed
    assert h.restarts("wake_mismatch") == 1.0
    assert "wake mismatch" in (h.supervisor.last_error or "")


async def test_a_wake_asked_before_the_sleep_was_sent_returns_to_ready_without_sleeping(build: Build) -> None:
    h = build()
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    assert h.supervisor.request_wake()
    await h.until_state(State.READY)
    assert h.world.sleeps == 0 and h.world.wakes == 0


async def test_an_engine_that_exits_asleep_restarts(build: Build) -> None:
    h = build()
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    await h.until(lambda: h.supervisor.sleep.asleep)
    h.world.engines[0].exit(-9)
    await h.until(lambda: len(h.world.engines) == 2 and h.supervisor.state is State.READY)
    assert h.restarts("engine_exited") == 1.0 and not h.supervisor.sleep.asleep


async def test_a_failed_sleep_restarts_the_engine(build: Build) -> None:
    h = build(sleep_ok=False)
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    await h.until(lambda: len(h.world.engines) == 2)
    assert h.restarts("sleep_failed") == 1.0


async def test_a_sleeping_replica_drains_and_stops(build: Build) -> None:
    h = build()
    await h.until_state(State.READY)
    h.supervisor.request_sleep()
    await h.until(lambda: h.supervisor.sleep.asleep)
    assert h.supervisor.request_drain()
    await h.until_state(State.STOPPED)
    assert await h.task == 0


@pytest.mark.parametrize(
    ("overrides", "state_before"),
    [({}, State.READY), (SLEEPY, State.STARTING)],
    ids=["sleep-mode-off", "not-ready"],
)
async def test_sleep_is_refused_without_sleep_mode_or_unless_ready(
    build: Build, overrides: dict[str, Any], state_before: State
) -> None:
    h = build(pool_overrides=overrides)
    await h.until_state(state_before)
    assert not h.supervisor.request_sleep()
    assert not h.supervisor.request_wake()
    assert h.supervisor.state is state_before
