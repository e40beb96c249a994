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
* draining   -- readiness is already false (it fell the moment the drain was requested). Wait
  ``drain.propagationSeconds`` so gateways stop routing, SIGTERM the engine (its ``--shutdown-timeout`` lets
  accepted requests finish), wait for running + waiting = 0 and its exit up to the grace deadline, SIGKILL
  the process group after it. A final drain ends in ``stopped``; a planned one restarts the engine.
* restarting -- crash restarts wait an exponential backoff with jitter; too many in the crash window -> failed.
* failed     -- no restarts until ``request_reset()`` (operator) or the crash window lets one through.

``request_drain()`` and ``request_reset()`` are called from the API and signal handlers; the drain fires its
transition synchronously so ``/readyz`` drops at once. Handlers re-check the state after every await because
a drain may have preempted them. All I/O edges (spawner, engine client, control client, clock, randomness)
are injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.clock import Clock
from agent.control import ControlClient
from agent.engine_client import EngineClient, Health
from agent.launchers import EngineHandle
from agent.metrics import AgentMetrics
from agent.model_store import FetchError
from agent.restarts import CrashHistory, RestartPolicy
from agent.rollover import Rollover
from agent.states import Event, State, StateMachine, Transition
from fleet.protocol.promtext import EngineMetrics
from fleet.spec.stack import PoolSpec

__all__ = ["Supervisor", "SupervisorSettings"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_INTERRUPTED: Any = object()


@dataclass(frozen=True)
class SupervisorSettings:
    probe_interval_s: float = 1.0
    liveness_failures: int = 3  # consecutive failed /health checks -> restart
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    lease_retry_s: float = 5.0  # after a refused lease, ask again (jittered) while the window is open
    drain_poll_s: float = 0.25
    idle_exit_grace_s: float = 10.0  # engine idle but still alive after SIGTERM: SIGKILL after this
    kill_margin_s: float = 2.0  # finish this long before the drain grace ends (the pod's own SIGKILL)


class Supervisor:
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
        self.machine = StateMachine(clock.monotonic, State.STARTING if fetch is None else State.FETCHING)
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
        self._restart_reason = "crash"
        self._reset_requested = False
        self._wake = asyncio.Event()
        self._drain_event = asyncio.Event()
        self.listeners: list[Callable[[Transition], None]] = []
        self._tasks: set[asyncio.Future[None]] = set()

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
        self._drain_event.set()
        self._wake.set()
        return True

    def request_reset(self) -> bool:
        """Operator reset of a crash-looping replica; False unless it is failed."""
        if self.state is not State.FAILED:
            return False
        self._reset_requested = True
        self._wake.set()
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
        for listener in self.listeners:
            listener(transition)

    def _fire(self, expected: State, event: Event) -> bool:
        """Fire unless a drain preempted the handler that owns ``expected``."""
        if self.state is not expected:
            return False
        self.machine.fire(event)
        return True

    async def _pause(self, seconds: float) -> None:
        """Sleep on the injected clock; a command or the engine exiting wakes it early."""
        if self._wake.is_set():
            self._wake.clear()
            return
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
        self._wake.clear()

    async def _unless_drained(self, call: Awaitable[T]) -> T:
        """Await ``call`` but give up (returning _INTERRUPTED) as soon as a final drain is requested."""
        task = asyncio.ensure_future(call)
        drained = asyncio.ensure_future(self._drain_event.wait())
        try:
            await asyncio.wait({task, drained}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait({task})
        result: T = _INTERRUPTED
        return result

    def _exited(self) -> bool:
        return self.engine is None or self.engine.returncode is not None

    def _failure(self, expected: State, event: Event, reason: str) -> None:
        if self.state is not expected:
            return
        if self.engine is not None:
            self.last_exit_code = self.engine.returncode
            self.engine.kill()
        self.crashes.record(self._clock.monotonic())
        self._restart_reason = reason
        self.last_error = f"engine {reason.replace('_', ' ')} (exit code {self.last_exit_code})"
        log.warning("%s", self.last_error)
        self.machine.fire(event)

    # ---- state handlers ---------------------------------------------------------------------------------

    async def _fetching(self) -> None:
        fetch = self._fetch
        assert fetch is not None

        async def fetched() -> bool:
            await fetch()
            return True

        try:
            done = await self._unless_drained(fetched())
        except FetchError as exc:
            if self.state is State.FETCHING:
                self.crashes.record(self._clock.monotonic())
                self._restart_reason = "fetch_failed"
                self.last_error = f"model fetch failed: {exc}"
                log.error("%s", self.last_error)
                self.machine.fire(Event.FETCH_FAILED)
            return
        if done is not _INTERRUPTED:
            self._fetched = True
            self._fire(State.FETCHING, Event.FETCHED)

    async def _starting(self) -> None:
        if self.engine is None:
            try:
                engine = await self._spawn()
            except OSError as exc:
                log.error("cannot start the engine: %s", exc)
                self._failure(State.STARTING, Event.ENGINE_EXITED, "spawn_failed")
                return
            self.engine, self.engine_started_at, self.engine_version = engine, self._clock.monotonic(), None
            watcher = asyncio.ensure_future(self._watch(engine))
            self._tasks.add(watcher)
            watcher.add_done_callback(self._tasks.discard)
        assert self.engine_started_at is not None
        deadline = self.engine_started_at + self.pool.cold_start_seconds
        while self.state is State.STARTING:
            if self._exited():
                return self._failure(State.STARTING, Event.ENGINE_EXITED, "engine_exited")
            if self._clock.monotonic() >= deadline:
                return self._failure(State.STARTING, Event.STARTUP_TIMEOUT, "startup_timeout")
            health = await self._unless_drained(self._engine_client.health())
            if health is Health.OK:
                self._fire(State.STARTING, Event.HEALTHY)
                return
            await self._pause(self.settings.probe_interval_s)

    async def _watch(self, engine: EngineHandle) -> None:
        code = await engine.wait()
        if engine is self.engine:
            self.last_exit_code = code
            self._wake.set()

    async def _warming(self) -> None:
        assert self.engine_started_at is not None
        deadline = self.engine_started_at + self.pool.cold_start_seconds
        while self.state is State.WARMING:
            if self._exited():
                return self._failure(State.WARMING, Event.ENGINE_EXITED, "engine_exited")
            if self._clock.monotonic() >= deadline:
                return self._failure(State.WARMING, Event.STARTUP_TIMEOUT, "startup_timeout")
            warmed = await self._unless_drained(self._engine_client.warm_up())
            if warmed is True:
                version = await self._unless_drained(self._engine_client.version())
                self.engine_version = version if isinstance(version, str) else None
                if self._fire(State.WARMING, Event.WARMED) and self.rollover.held:
                    await self.rollover.release()
                return
            await self._pause(self.settings.probe_interval_s)

    async def _ready(self) -> None:
        failures = 0
        while self.state is State.READY:
            if self._exited():
                return self._failure(State.READY, Event.ENGINE_EXITED, "engine_exited")
            health = await self._unless_drained(self._engine_client.health())
            if not self.machine.ready:  # a drain preempted the check
                return
            failures = 0 if health is Health.OK else failures + 1
            if failures >= self.settings.liveness_failures and not self._exited():
                return self._failure(State.READY, Event.LIVENESS_FAILED, "liveness_failed")
            if health is Health.OK and await self._planned_restart():
                return
            await self._pause(self.settings.probe_interval_s)

    async def _planned_restart(self) -> bool:
        """Inside the restart window: try for a lease (`agent.rollover`); True when the planned restart began."""
        if not await self.rollover.acquire(self.engine_uptime_s()):
            return False
        self._restart_reason = "planned"
        if not self._fire(State.READY, Event.PLANNED_RESTART):
            return False  # a drain won the race; the lease goes back when it ends
        log.info("restart window: lease granted, draining for a planned restart")
        return True

    async def _draining(self) -> None:
        drain = self.pool.drain
        started = self.machine.since
        deadline = started + drain.grace_seconds - self.settings.kill_margin_s
        engine = self.engine
        if engine is not None and engine.returncode is None:
            if self._drain_source is State.READY:
                # Gateways still route here until they see readiness fall: keep serving meanwhile.
                await self._clock.sleep(min(drain.propagation_seconds, max(0.0, deadline - started)))
            engine.terminate()
            await self._await_engine_idle(engine, deadline)
            if engine.returncode is None:
                log.warning("engine still running at the drain deadline: SIGKILL")
            engine.kill()
            await self._reap(engine)
        self.engine, self.engine_started_at = None, None
        if self._final_drain:
            if self.rollover.held:
                await self.rollover.release()
            self.machine.fire(Event.DRAINED)
        else:
            self.machine.fire(Event.RESTART_DRAINED)

    async def _await_engine_idle(self, engine: EngineHandle, deadline: float) -> None:
        """Until the engine exits, or is idle for ``idle_exit_grace_s``, or the deadline passes."""
        idle_since: float | None = None
        while engine.returncode is None and self._clock.monotonic() < deadline:
            in_flight: float | None = None
            with contextlib.suppress(Exception):
                metrics = EngineMetrics.from_text(await self._engine_client.metrics())
                in_flight = metrics.running + metrics.waiting
            now = self._clock.monotonic()
            if in_flight == 0:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= self.settings.idle_exit_grace_s:
                    return
            else:
                idle_since = None
            await self._pause(min(self.settings.drain_poll_s, max(0.0, deadline - now)))

    async def _reap(self, engine: EngineHandle) -> None:
        # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation racing the result.
        waiter = asyncio.ensure_future(engine.wait())
        try:
            await asyncio.wait({waiter}, timeout=10.0)
        finally:
            waiter.cancel()

    async def _restarting(self) -> None:
        if self.engine is not None:
            self.engine.kill()
            await self._reap(self.engine)
            self.engine, self.engine_started_at = None, None
        if self._restart_reason != "planned":
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
                await self._pause(until - self._clock.monotonic())
        if not self._fetched:
            self._fire(State.RESTARTING, Event.REFETCH)
        elif self._fire(State.RESTARTING, Event.RESPAWN):
            self.restarts += 1
            self._metrics.restarts.labels(self._restart_reason).inc()

    async def _failed(self) -> None:
        while self.state is State.FAILED:
            now = self._clock.monotonic()
            if self._reset_requested:
                self._reset_requested = False
                self.crashes.clear()
                self._restart_reason = "reset"
                self.machine.fire(Event.RESET)
                return
            until = self.crashes.cooldown_until(now)
            if now >= until:
                self._restart_reason = "cooldown"
                self.machine.fire(Event.COOLDOWN_ELAPSED)
                return
            await self._pause(min(self.settings.probe_interval_s, until - now))
