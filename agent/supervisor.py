"""Supervisor: drives one engine through the agent's state machine (start, warm up, serve, drain, restart).

One handler per state runs until it fires an event; the loop then runs the next state's handler.

* fetching   -- (only with a model store) the injected ``fetch`` brings the weights into the node cache
  (`agent.model_store`). A `FetchError` counts as a crash: back off in ``restarting`` and fetch again, until
  the crash window declares a loop (``failed``); ``last_error`` carries the reason. Once a fetch succeeded,
  restarts respawn the engine from the local copy.
* starting   -- spawn the engine; probe ``/health`` every ``probe_interval_s``: connection refused (vLLM binds
  but does not listen while loading) means "still starting" until ``pool.coldStartSeconds`` after the spawn.
* warming    -- a short completion must succeed before the replica is ready, within the same deadline.
* ready      -- liveness: ``liveness_failures`` consecutive failed checks, or the process exiting, restart it.
  Inside the pool's restart window (and past its minimum uptime) ask the control plane for a restart lease;
  no lease, no restart; an unreachable control plane skips this window occurrence (`agent.rollover`).
* draining   -- readiness is already false (it fell the moment the drain was requested); `agent.drain` stops
  the engine within the grace (seconds when never ready); a final drain ends in ``stopped``, a planned one restarts.
* restarting -- crash restarts wait an exponential backoff with jitter; too many in the crash window -> failed.
* failed     -- no restarts until ``request_reset()`` (operator) or the crash window lets one through.
* sleeping   -- (sleep mode, ``request_sleep()``) not ready; `agent.sleeping` leaves routing and sleeps the engine at
  level 1, then the process is watched until ``request_wake()``. A failed sleep restarts the engine.
* waking     -- wake, then the greedy check must answer as before the sleep, else the engine restarts cold.

The commands (``request_drain/reset/sleep/wake``) are called from the API and signal handlers; a drain or a sleep
fires its transition synchronously so ``/readyz`` drops at once. Handlers re-check the state after every await
because a drain may have preempted them (`agent.waits`). All I/O edges (spawner, engine client, control client,
clock, randomness) are injected. Every restart has a `RestartReason`, counted by reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from agent.control import ControlClient
from agent.drain import StopBounds, reap, stop_engine
from agent.engine_client import EngineClient, Health
from agent.launchers import EngineHandle
from agent.metrics import AgentMetrics
from agent.model_store import FetchError
from agent.restarts import CrashHistory, RestartPolicy, RestartReason
from agent.rollover import Rollover
from agent.sleeping import SleepCycle, SleepOutcome, WakeOutcome
from agent.states import Event, State, StateMachine, Transition
from agent.waits import INTERRUPTED, Waits
from fleet.protocol.clock import Clock
from fleet.spec.stack import PoolSpec

__all__ = ["Supervisor", "SupervisorSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorSettings:
    probe_interval_s: float = 1.0
    liveness_failures: int = 3  # consecutive failed /health checks -> restart
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    lease_retry_s: float = 5.0  # after a refused lease, ask again (jittered) while the window is open
    drain_poll_s: float = 0.25
    idle_exit_grace_s: float = 20.0  # engine idle but still alive after SIGTERM: SIGKILL after this (vLLM: 8-13 s)
    starting_exit_grace_s: float = 5.0  # never ready and still alive after SIGTERM (vLLM ignores it): SIGKILL
    kill_margin_s: float = 2.0  # finish this long before the drain grace ends (the pod's own SIGKILL)


class Supervisor:
    """One engine through its lifecycle; ``machine`` holds the state (subscribe to it for transitions)."""

    def __init__(
        self,
        pool: PoolSpec,
        replica: str,
        spawn: Callable[[], Awaitable[EngineHandle]],
        engine_client: EngineClient,
        control: ControlClient,
        clock: Clock,
        metrics: AgentMetrics,
        settings: SupervisorSettings | None = None,
        rand: Callable[[], float] = random.random,
        fetch: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.pool = pool
        self.replica = replica
        self.settings = settings or SupervisorSettings()
        self._spawn = spawn
        self._engine_client = engine_client
        self._clock = clock
        self._metrics = metrics
        self._rand = rand
        self._fetch = fetch
        self._fetched = fetch is None  # weights are local (or the engine loads them itself)
        self.machine = StateMachine(clock, State.STARTING if fetch is None else State.FETCHING)
        self.machine.subscribe(metrics.on_transition)
        self.machine.subscribe(self._on_transition)
        self.crashes = CrashHistory(self.settings.restart)
        self.rollover = Rollover(pool, replica, control, clock, metrics, self.settings.lease_retry_s, rand)
        self.engine: EngineHandle | None = None
        self.engine_started_at: float | None = None
        self.engine_version: str | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_error: str | None = None  # why the engine or the fetch last failed, for /status
        self._final_drain = False
        self._drain_source: State | None = None
        self._restart_reason = RestartReason.CRASH
        self._reset_requested = False
        self._waits = Waits(clock)
        self._tasks: set[asyncio.Future[None]] = set()
        propagation_s, idle_timeout_s = pool.drain.propagation_seconds, pool.drain.shutdown_timeout
        self.sleep = SleepCycle(engine_client, clock, self._waits.pause, propagation_s, idle_timeout_s)
        self._wake_requested = False

    # ---- commands (API, signals) -------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.machine.state

    def request_drain(self) -> bool:
        """Stop for good: readiness false now, then drain the engine and stop. False when already stopping."""
        if self._final_drain or self.state is State.STOPPED:
            return False
        self._final_drain = True
        if self.machine.accepts(Event.DRAIN):
            self.machine.fire(Event.DRAIN)
        self._waits.drain()
        self._waits.wake()
        return True

    def request_reset(self) -> bool:
        """Operator reset of a crash-looping replica; False unless it is failed."""
        if self.state is not State.FAILED:
            return False
        self._reset_requested = True
        self._waits.wake()
        return True

    def request_sleep(self) -> bool:
        """Readiness false now, then leave routing and sleep the engine; False unless ready with sleep mode on."""
        if not self.pool.engine.sleep_mode or self.state is not State.READY:
            return False
        self._wake_requested = False
        self.machine.fire(Event.SLEEP)
        self._waits.wake()
        return True

    def request_wake(self) -> bool:
        """Wake a sleeping engine (or cancel a sleep not yet sent); False unless sleeping."""
        if self.state is not State.SLEEPING or self._wake_requested:
            return False
        self._wake_requested = True
        self._waits.wake()
        return True

    def engine_uptime_s(self) -> float:
        if self.engine_started_at is None:
            return 0.0
        return self._clock.monotonic() - self.engine_started_at

    # ---- the loop ---------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Supervise until stopped; returns the process exit code (0 after a drain)."""
        handlers: dict[State, Callable[[], Coroutine[Any, Any, None]]] = {
            State.FETCHING: self._fetching,
            State.STARTING: self._starting,
            State.WARMING: self._warming,
            State.READY: self._ready,
            State.DRAINING: self._draining,
            State.RESTARTING: self._restarting,
            State.FAILED: self._failed,
            State.SLEEPING: self._sleeping,
            State.WAKING: self._waking,
        }
        try:
            while self.state is not State.STOPPED:
                await handlers[self.state]()
        finally:
            if self.engine is not None and self.engine.returncode is None:
                self.engine.kill()  # never leave an orphaned engine behind a dying agent
        return 0

    def _on_transition(self, transition: Transition) -> None:
        log.info("%s --%s--> %s", transition.source.value, transition.event.value, transition.target.value)
        if transition.target is State.DRAINING:
            self._drain_source = transition.source

    def _fire(self, expected: State, event: Event) -> bool:
        """Fire unless a drain preempted the handler that owns ``expected``."""
        if self.state is not expected:
            return False
        self.machine.fire(event)
        return True

    def _exited(self) -> bool:
        return self.engine is None or self.engine.returncode is not None

    def _failure(self, expected: State, event: Event, reason: RestartReason) -> None:
        if self.state is not expected:
            return
        if self.engine is not None:
            self.last_exit_code = self.engine.returncode
            self.engine.kill()
        self.crashes.record(self._clock.monotonic())
        self._restart_reason = reason
        self.last_error = f"engine {reason.value.replace('_', ' ')} (exit code {self.last_exit_code})"
        log.warning("%s", self.last_error)
        self.machine.fire(event)

    # ---- state handlers ---------------------------------------------------------------------------------

    async def _fetching(self) -> None:
        assert self._fetch is not None
        try:
            done = await self._waits.unless_drained(self._fetch())  # None, or INTERRUPTED by a drain
        except FetchError as exc:
            if self.state is State.FETCHING:
                self.crashes.record(self._clock.monotonic())
                self._restart_reason = RestartReason.FETCH_FAILED
                self.last_error = f"model fetch failed: {exc}"
                log.error("%s", self.last_error)
                self.machine.fire(Event.FETCH_FAILED)
            return
        if done is not INTERRUPTED:
            self._fetched = True
            self._fire(State.FETCHING, Event.FETCHED)

    async def _starting(self) -> None:
        if self.engine is None:
            try:
                engine = await self._spawn()
            except OSError as exc:
                log.error("cannot start the engine: %s", exc)
                self._failure(State.STARTING, Event.ENGINE_EXITED, RestartReason.SPAWN_FAILED)
                return
            self.engine, self.engine_started_at, self.engine_version = engine, self._clock.monotonic(), None
            self.sleep.forget()
            watcher = asyncio.ensure_future(self._watch(engine))
            self._tasks.add(watcher)
            watcher.add_done_callback(self._tasks.discard)
        while self.state is State.STARTING:
            if self._startup_failed(State.STARTING):
                return
            health = await self._waits.unless_drained(self._engine_client.health())
            if health is Health.OK:
                self._fire(State.STARTING, Event.HEALTHY)
                return
            await self._waits.pause(self.settings.probe_interval_s)

    async def _watch(self, engine: EngineHandle) -> None:
        code = await engine.wait()
        if engine is self.engine:
            self.last_exit_code = code
            self._waits.wake()

    def _startup_failed(self, state: State) -> bool:
        """In ``starting`` or ``warming``: True (the failure fired) when the engine exited or the cold start ran
        past ``pool.coldStartSeconds`` since the spawn."""
        assert self.engine_started_at is not None
        if self._exited():
            self._failure(state, Event.ENGINE_EXITED, RestartReason.ENGINE_EXITED)
            return True
        if self._clock.monotonic() >= self.engine_started_at + self.pool.cold_start_seconds:
            self._failure(state, Event.STARTUP_TIMEOUT, RestartReason.STARTUP_TIMEOUT)
            return True
        return False

    async def _warming(self) -> None:
        while self.state is State.WARMING:
            if self._startup_failed(State.WARMING):
                return
            warmed = await self._waits.unless_drained(self._engine_client.warm_up())
            if warmed is True:
                version = await self._waits.unless_drained(self._engine_client.version())
                self.engine_version = None if version is INTERRUPTED else version
                if self._fire(State.WARMING, Event.WARMED) and self.rollover.held:
                    await self.rollover.release()
                return
            await self._waits.pause(self.settings.probe_interval_s)

    async def _ready(self) -> None:
        failures = 0
        while self.state is State.READY:
            if self._exited():
                return self._failure(State.READY, Event.ENGINE_EXITED, RestartReason.ENGINE_EXITED)
            health = await self._waits.unless_drained(self._engine_client.health())
            if not self.machine.ready:  # a drain preempted the check
                return
            failures = 0 if health is Health.OK else failures + 1
            if failures >= self.settings.liveness_failures and not self._exited():
                return self._failure(State.READY, Event.LIVENESS_FAILED, RestartReason.LIVENESS_FAILED)
            if health is Health.OK and await self._planned_restart():
                return
            await self._waits.pause(self.settings.probe_interval_s)

    def _sleep_wanted(self) -> bool:
        return self.state is State.SLEEPING and not self._wake_requested

    async def _sleeping(self) -> None:
        if not self.sleep.asleep and await self.sleep.fall_asleep(self._sleep_wanted) is SleepOutcome.FAILED:
            return self._failure(State.SLEEPING, Event.SLEEP_FAILED, RestartReason.SLEEP_FAILED)
        while self._sleep_wanted():  # asleep: only the process is watched (a sleeping vLLM's /health stays 200)
            if self._exited():
                return self._failure(State.SLEEPING, Event.ENGINE_EXITED, RestartReason.ENGINE_EXITED)
            await self._waits.pause(self.settings.probe_interval_s)
        if self._wake_requested:
            self._wake_requested = False
            self._fire(State.SLEEPING, Event.WAKE)

    async def _waking(self) -> None:
        if self.sleep.asleep:
            outcome = await self._waits.unless_drained(self.sleep.wake())
            if outcome is WakeOutcome.FAILED or self._exited():
                return self._failure(State.WAKING, Event.WAKE_FAILED, RestartReason.WAKE_FAILED)
            if outcome is WakeOutcome.MISMATCH:
                return self._failure(State.WAKING, Event.WAKE_FAILED, RestartReason.WAKE_MISMATCH)
        self._fire(State.WAKING, Event.WOKEN)

    async def _planned_restart(self) -> bool:
        """Inside the restart window: try for a lease (`agent.rollover`); True when the planned restart began."""
        if not await self.rollover.acquire(self.engine_uptime_s()):
            return False
        self._restart_reason = RestartReason.PLANNED
        if not self._fire(State.READY, Event.PLANNED_RESTART):
            return False  # a drain won the race; the lease goes back when it ends
        log.info("restart window: lease granted, draining for a planned restart")
        return True

    async def _draining(self) -> None:
        drain, settings = self.pool.drain, self.settings
        started = self.machine.since
        deadline = started + drain.grace_seconds - settings.kill_margin_s
        engine = self.engine
        if engine is not None and engine.returncode is None:
            # Gateways still route here until they see readiness fall: keep serving meanwhile.
            from_ready = self._drain_source is State.READY
            # Never ready (starting, warming): it accepted nothing, and vLLM ignores a SIGTERM while it starts.
            grace = settings.starting_exit_grace_s if self._drain_source in (State.STARTING, State.WARMING) else None
            await stop_engine(
                engine,
                self._engine_client,
                self._clock,
                self._waits.pause,
                propagation_s=min(drain.propagation_seconds, max(0.0, deadline - started)) if from_ready else None,
                bounds=StopBounds(deadline, settings.idle_exit_grace_s, grace, settings.drain_poll_s),
            )
        self.engine, self.engine_started_at = None, None
        if self._final_drain:
            if self.rollover.held:
                await self.rollover.release()
            self.machine.fire(Event.DRAINED)
        else:
            self.machine.fire(Event.RESTART_DRAINED)

    async def _restarting(self) -> None:
        if self.engine is not None:
            self.engine.kill()
            await reap(self.engine)
            self.engine, self.engine_started_at = None, None
        if self._restart_reason is not RestartReason.PLANNED:
            now = self._clock.monotonic()
            if self.crashes.crash_looping(now):
                log.error(
                    "crash loop: %d failures in %.0f s; not restarting until reset",
                    self.crashes.recent(now),
                    self.crashes.policy.window_s,
                )
                self.machine.fire(Event.CRASH_LOOP)
                return
            delay = self.crashes.backoff_s(now, self._rand())
            log.info("restarting the engine in %.2f s", delay)
            until = now + delay
            while self.state is State.RESTARTING and self._clock.monotonic() < until:
                await self._waits.pause(until - self._clock.monotonic())
        await self.rollover.renew()  # a planned restart's lease covers one start; this is another
        if not self._fetched:
            self._fire(State.RESTARTING, Event.REFETCH)
        elif self._fire(State.RESTARTING, Event.RESPAWN):
            self.restarts += 1
            self._metrics.restarts.labels(self._restart_reason.value).inc()

    async def _failed(self) -> None:
        while self.state is State.FAILED:
            now = self._clock.monotonic()
            if self._reset_requested:
                self._reset_requested = False
                self.crashes.clear()
                self._restart_reason = RestartReason.RESET
                self.machine.fire(Event.RESET)
                return
            until = self.crashes.cooldown_until(now)
            if now >= until:
                self._restart_reason = RestartReason.COOLDOWN
                self.machine.fire(Event.COOLDOWN_ELAPSED)
                return
            await self._waits.pause(min(self.settings.probe_interval_s, until - now))
