"""Supervisor lifecycle under a virtual clock, a fake spawner and a scripted engine (no processes)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from agent.control import ControlClient
from agent.metrics import AgentMetrics
from agent.restarts import RestartPolicy
from agent.states import Event, State
from agent.supervisor import Supervisor, SupervisorSettings
from tests.agent.builders import FakeWorld, VirtualClock
from tests.support import stacks

SETTINGS = SupervisorSettings(
    probe_interval_s=1.0,
    liveness_failures=3,
    restart=RestartPolicy(max_restarts=2, window_s=300.0, backoff_base_s=1.0, backoff_max_s=8.0, jitter=0.0),
    lease_retry_s=5.0,
    idle_exit_grace_s=3.0,
)


@dataclass
class LeaseDesk:
    """The control plane's lease contract, answered through httpx.MockTransport."""

    max_unavailable: int = 1
    up: bool = True
    holders: set[str] | None = None

    def __post_init__(self) -> None:
        self.holders = set()
        self.requests: list[tuple[str, str]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert self.holders is not None
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        self.requests.append((request.method, request.url.path))
        if request.method == "POST" and request.url.path == "/v1/leases/restart":
            import json

            body = json.loads(request.content)
            if body["replica"] not in self.holders and len(self.holders) >= self.max_unavailable:
                return httpx.Response(409, json={"error": {"message": "busy", "type": "conflict", "code": 409}})
            self.holders.add(body["replica"])
            grant = {"pool": body["pool"], "replica": body["replica"], "expires_at": 1e10, "holders": []}
            return httpx.Response(200, json=grant)
        if request.method == "DELETE":
            self.holders.discard(request.url.path.rsplit("/", 1)[-1])
            return httpx.Response(204)
        return httpx.Response(202)


@dataclass
class Harness:
    supervisor: Supervisor
    world: FakeWorld
    clock: VirtualClock
    desk: LeaseDesk
    task: asyncio.Task[int]

    async def until(self, predicate: Callable[[], bool], steps: int = 20_000) -> None:
        for _ in range(steps):
            if predicate():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"condition not reached; state={self.supervisor.state}, t={self.clock.now}")

    async def until_state(self, state: State) -> None:
        await self.until(lambda: self.supervisor.state is state)

    def events(self) -> list[Event]:
        return [t.event for t in self.supervisor.machine.history]


@pytest.fixture
async def harness_factory() -> AsyncIterator[Callable[..., Harness]]:
    tasks: list[asyncio.Task[int]] = []

    def build(
        pool_overrides: dict[str, object] | None = None, settings: SupervisorSettings = SETTINGS, **world_kw: object
    ) -> Harness:
        clock = VirtualClock()
        world = FakeWorld(clock, **world_kw)  # type: ignore[arg-type]
        desk = LeaseDesk()
        http = httpx.AsyncClient(transport=httpx.MockTransport(desk.handler))
        control = ControlClient(http, "http://control-plane")
        pool = stacks.pool(**(pool_overrides or {}))
        supervisor = Supervisor(
            pool, "r0", world.spawn, world, control, clock, AgentMetrics("r0", pool.name), settings, rand=lambda: 0.5
        )
        task = asyncio.ensure_future(supervisor.run())
        tasks.append(task)
        return Harness(supervisor, world, clock, desk, task)

    yield build
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_startup_goes_starting_warming_ready_only_after_warm_up(harness_factory) -> None:
    h = harness_factory(startup_s=5.0)
    await h.until(lambda: h.world.engine is not None)
    assert h.supervisor.state is State.STARTING and not h.supervisor.machine.ready
    await h.until_state(State.READY)
    assert h.events() == [Event.HEALTHY, Event.WARMED]
    assert h.clock.now - h.world.spawned_at[0] >= 5.0  # refused until the engine listened
    assert h.world.warmups >= 1 and h.supervisor.engine_version == "sim-test"


async def test_failing_warm_up_keeps_it_unready_until_the_cold_start_deadline(harness_factory) -> None:
    h = harness_factory(startup_s=1.0, warm_ok=False)
    await h.until_state(State.WARMING)
    await h.until(lambda: Event.STARTUP_TIMEOUT in h.events())
    assert State.READY not in [t.target for t in h.supervisor.machine.history]
    assert h.world.engines[0].killed
    assert h.clock.now - h.world.spawned_at[0] >= 20.0  # coldStartSeconds


async def test_engine_never_listening_times_out_and_is_restarted(harness_factory) -> None:
    h = harness_factory(startup_s=1e9)
    await h.until(lambda: len(h.world.engines) == 2)
    assert h.events()[:2] == [Event.STARTUP_TIMEOUT, Event.RESPAWN]
    assert h.supervisor.restarts == 1


async def test_engine_exit_while_ready_restarts_with_backoff(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    h.world.engines[0].exit(-9)
    crashed_at = h.clock.now
    await h.until(lambda: len(h.world.engines) == 2)
    assert h.world.spawned_at[1] - crashed_at >= SETTINGS.restart.backoff_base_s
    await h.until_state(State.READY)
    assert h.supervisor.restarts == 1 and h.supervisor.last_exit_code == -9


async def test_consecutive_failed_health_checks_restart_a_hung_engine(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    h.world.healthy = False
    await h.until(lambda: Event.LIVENESS_FAILED in h.events())
    assert h.world.engines[0].killed
    h.world.healthy = True
    await h.until(lambda: h.supervisor.restarts == 1 and h.supervisor.state is State.READY)


async def test_one_failed_health_check_is_tolerated(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    h.world.healthy = False
    t0 = h.clock.now
    await h.until(lambda: h.clock.now >= t0 + 1.5)
    h.world.healthy = True
    t1 = h.clock.now
    await h.until(lambda: h.clock.now >= t1 + 10)
    assert Event.LIVENESS_FAILED not in h.events() and h.supervisor.state is State.READY


async def test_crash_loop_ends_in_failed_and_an_operator_reset_restarts(harness_factory) -> None:
    h = harness_factory(startup_s=1.0, crash_on_start=True)
    await h.until_state(State.FAILED)
    assert len(h.world.engines) == SETTINGS.restart.max_restarts + 1
    spawned = len(h.world.engines)
    t0 = h.clock.now
    await h.until(lambda: h.clock.now >= t0 + 60)
    assert h.supervisor.state is State.FAILED and len(h.world.engines) == spawned  # no restarts while failed
    h.world.crash_on_start = False
    assert h.supervisor.request_reset()
    await h.until_state(State.READY)
    assert Event.RESET in h.events()


async def test_failed_replica_restarts_again_once_the_crash_window_passes(harness_factory) -> None:
    h = harness_factory(startup_s=1.0, crash_on_start=True)
    await h.until_state(State.FAILED)
    first_failure = h.supervisor.machine.history[0].at
    h.world.crash_on_start = False
    await h.until_state(State.READY)
    assert Event.COOLDOWN_ELAPSED in h.events()
    assert h.clock.now >= first_failure + SETTINGS.restart.window_s


async def test_reset_is_refused_unless_failed(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    assert not h.supervisor.request_reset()


async def test_drain_drops_readiness_at_once_waits_propagation_then_sigterms(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    engine = h.world.engines[0]
    t0 = h.clock.now
    assert h.supervisor.request_drain()
    assert h.supervisor.state is State.DRAINING and not h.supervisor.machine.ready
    await h.until(lambda: engine.terminated_at is not None)
    assert h.clock.now - t0 >= 0.5  # propagationSeconds
    assert await asyncio.wait_for(h.task, 5) == 0
    assert h.supervisor.state is State.STOPPED and h.events()[-2:] == [Event.DRAIN, Event.DRAINED]


async def test_drain_waits_for_in_flight_requests_then_sigkills_at_the_deadline(harness_factory) -> None:
    h = harness_factory(startup_s=1.0, ignores_sigterm=True)
    await h.until_state(State.READY)
    h.world.in_flight = 4
    t0 = h.clock.now
    h.supervisor.request_drain()
    await asyncio.wait_for(h.task, 5)
    engine = h.world.engines[0]
    assert engine.killed
    grace = h.supervisor.pool.drain.grace_seconds
    assert grace - SETTINGS.kill_margin_s <= h.clock.now - t0 <= grace + 1


async def test_idle_engine_that_does_not_exit_is_stopped_early(harness_factory) -> None:
    h = harness_factory(startup_s=1.0, ignores_sigterm=True)
    await h.until_state(State.READY)
    t0 = h.clock.now
    h.supervisor.request_drain()
    await asyncio.wait_for(h.task, 5)
    assert h.world.engines[0].killed
    assert h.clock.now - t0 < h.supervisor.pool.drain.grace_seconds - SETTINGS.kill_margin_s


async def test_drain_during_startup_skips_propagation(harness_factory) -> None:
    h = harness_factory(startup_s=100.0)
    await h.until(lambda: h.world.engine is not None)
    t0 = h.clock.now
    h.supervisor.request_drain()
    assert await asyncio.wait_for(h.task, 5) == 0
    assert h.clock.now - t0 < 0.5 and h.world.engines[0].returncode is not None


LONG_GRACE = {"drain.graceSeconds": 120}  # prod's: a drain that waits out its deadline takes 118 s


@pytest.mark.parametrize(
    ("case", "world_kw", "state"),
    [
        ("starting: not listening yet", {"startup_s": 1e9}, State.STARTING),
        ("warming: listening and idle, warm-up failing", {"startup_s": 1.0, "warm_ok": False}, State.WARMING),
    ],
)
async def test_drain_before_ready_sigkills_an_engine_ignoring_sigterm_after_the_starting_grace(
    harness_factory, case: str, world_kw: dict[str, object], state: State
) -> None:
    settings = dataclasses.replace(SETTINGS, idle_exit_grace_s=30.0)  # longer than the starting grace
    h = harness_factory(LONG_GRACE, settings, ignores_sigterm=True, **world_kw)
    await h.until(lambda: h.world.engine is not None and h.supervisor.state is state)
    t0 = h.clock.now
    h.supervisor.request_drain()
    assert await asyncio.wait_for(h.task, 5) == 0, case
    assert h.world.engines[0].returncode == -9 and h.supervisor.state is State.STOPPED  # SIGKILLed
    assert h.clock.now - t0 == pytest.approx(settings.starting_exit_grace_s, abs=0.5)


async def test_default_idle_grace_lets_an_idle_vllm_finish_its_teardown(harness_factory) -> None:
    # vLLM 0.32 on CPU, idle after a drain: 8-13 s from SIGTERM to exit (5 s of them waiting for its worker).
    settings = dataclasses.replace(SupervisorSettings(), restart=SETTINGS.restart, drain_poll_s=1.0)
    h = harness_factory(LONG_GRACE, settings, startup_s=1.0, exits_after_s=13.0)
    await h.until_state(State.READY)
    h.supervisor.request_drain()
    assert await asyncio.wait_for(h.task, 5) == 0
    assert h.world.engines[0].returncode == 0  # it exited on its own, not SIGKILLed


async def test_second_drain_request_is_a_no_op(harness_factory) -> None:
    h = harness_factory(startup_s=1.0)
    await h.until_state(State.READY)
    assert h.supervisor.request_drain() and not h.supervisor.request_drain()
    await asyncio.wait_for(h.task, 5)


WINDOW_OPEN_NOW = {"restartWindow": {"enabled": True, "start": "00:00", "durationMinutes": 1440, "minUptimeHours": 0}}


async def test_planned_restart_takes_a_lease_restarts_and_releases_it(harness_factory) -> None:
    h = harness_factory(WINDOW_OPEN_NOW, startup_s=1.0)
    await h.until(lambda: len(h.world.engines) == 2 and h.supervisor.state is State.READY)
    assert [e for e in h.events()] == [
        Event.HEALTHY, Event.WARMED, Event.PLANNED_RESTART, Event.RESTART_DRAINED, Event.RESPAWN,
        Event.HEALTHY, Event.WARMED,
    ]  # fmt: skip
    assert ("DELETE", "/v1/leases/restart/qwen-7b/r0") in h.desk.requests and not h.desk.holders
    t0 = h.clock.now
    await h.until(lambda: h.clock.now >= t0 + 30)
    assert len(h.world.engines) == 2  # once per window occurrence


async def test_a_planned_restart_that_needs_another_start_renews_its_lease_before_it(harness_factory) -> None:
    # The restarted engine dies at once: its agent starts it again, still holding the lease, and renews it first
    # so it cannot expire mid-restart and let a second replica of the pool go down too.
    h = harness_factory(WINDOW_OPEN_NOW, startup_s=1.0)
    await h.until(lambda: h.supervisor.state is State.READY)
    h.world.crash_on_start = True
    await h.until(lambda: len(h.world.engines) == 3)
    h.world.crash_on_start = False
    await h.until(lambda: h.supervisor.state is State.READY and len(h.world.engines) >= 3)
    posts = [r for r in h.desk.requests if r == ("POST", "/v1/leases/restart")]
    deletes = [r for r in h.desk.requests if r[0] == "DELETE"]
    assert len(posts) >= 3 and len(deletes) == 1 and not h.desk.holders  # grant, renewals; released once ready


async def test_refused_lease_means_no_restart_until_granted(harness_factory) -> None:
    h = harness_factory(WINDOW_OPEN_NOW, startup_s=1.0)
    assert h.desk.holders is not None
    h.desk.holders.add("someone-else")
    await h.until_state(State.READY)
    t0 = h.clock.now
    await h.until(lambda: h.clock.now >= t0 + 30)
    assert len(h.world.engines) == 1 and h.supervisor.state is State.READY
    assert sum(1 for r in h.desk.requests if r[0] == "POST") >= 3  # it kept asking
    h.desk.holders.clear()
    await h.until(lambda: len(h.world.engines) == 2)


async def test_control_plane_down_skips_the_window(harness_factory) -> None:
    h = harness_factory(WINDOW_OPEN_NOW, startup_s=1.0)
    h.desk.up = False
    await h.until_state(State.READY)
    t0 = h.clock.now
    await h.until(lambda: h.clock.now >= t0 + 10)
    h.desk.up = True
    t1 = h.clock.now
    await h.until(lambda: h.clock.now >= t1 + 30)
    assert len(h.world.engines) == 1 and h.desk.requests == []  # skipped, not retried in this occurrence


async def test_final_drain_during_a_planned_restart_stops_and_releases(harness_factory) -> None:
    h = harness_factory(WINDOW_OPEN_NOW, startup_s=1.0)
    await h.until(lambda: Event.PLANNED_RESTART in h.events())
    h.supervisor.request_drain()
    assert await asyncio.wait_for(h.task, 5) == 0
    assert h.events()[-1] is Event.DRAINED and len(h.world.engines) == 1 and not h.desk.holders
