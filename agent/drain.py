"""Drain: stop one engine within the pod's drain grace, letting accepted requests finish.

Readiness has already fallen when this runs. From ``ready``, gateways still route here until they see that,
so the engine keeps serving for ``drain.propagationSeconds`` first. Then SIGTERM (the engine's own
``--shutdown-timeout`` lets accepted requests finish) and wait until the engine exits, or until the first of
three bounds (`StopBounds`), after which the process group gets SIGKILL:

* ``starting``  -- the engine never became ready (``starting`` or ``warming``): ``starting_grace_s`` after the
  SIGTERM. vLLM ignores a SIGTERM that arrives while it starts (it goes on starting, or hangs), and an engine that
  was never ready accepted no request, so nothing is lost.
* ``idle``      -- the engine reported running + waiting = 0 for ``idle_exit_grace_s``. An idle vLLM (0.32 on CPU)
  still takes 8-13 s to exit: it waits 5 s for its worker, then terminates it. A failed scrape does not restart
  the idle timer: once idle after the SIGTERM an engine stays idle (it refuses new requests), and its HTTP server
  is the first thing a finishing vLLM closes.
* ``deadline``  -- the drain grace less the kill margin, whatever the engine is doing.

`stop_engine` returns which one ended the wait (`Stop`), and logs it when it SIGKILLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.engine_client import EngineClient
from agent.launchers import EngineHandle
from fleet.protocol.clock import Clock
from fleet.protocol.promtext import EngineMetrics

__all__ = ["Stop", "StopBounds", "reap", "stop_engine"]

log = logging.getLogger(__name__)


class Stop(enum.Enum):
    """How a stop ended: the engine exited by itself, or the bound after which the agent SIGKILLed it."""

    EXITED = "exited"
    STARTING_GRACE = "starting grace"
    IDLE_GRACE = "idle exit grace"
    DEADLINE = "drain deadline"


@dataclass(frozen=True)
class StopBounds:
    """When the agent stops waiting for a SIGTERMed engine: whichever bound comes first."""

    deadline: float  # monotonic: the drain grace's end less the kill margin
    idle_exit_grace_s: float  # idle (running + waiting = 0) this long after the SIGTERM
    starting_grace_s: float | None = None  # never ready: this long after the SIGTERM; None: it was ready
    poll_s: float = 0.25  # the engine's /metrics, while it may still have requests in flight


async def stop_engine(
    engine: EngineHandle,
    engine_client: EngineClient,
    clock: Clock,
    pause: Callable[[float], Awaitable[None]],
    *,
    propagation_s: float | None,
    bounds: StopBounds,
) -> Stop:
    """Serve on for ``propagation_s`` (None when no gateway routed here), SIGTERM, wait for the exit or a bound,
    SIGKILL the group, reap. ``pause`` is the supervisor's wakeable sleep (the engine's exit wakes it)."""
    if propagation_s is not None:
        await clock.sleep(propagation_s)
    engine.terminate()
    terminated = clock.monotonic()
    if bounds.starting_grace_s is not None:
        stop = await _await_exit(engine, clock, pause, bounds, terminated + bounds.starting_grace_s)
    else:
        stop = await _await_engine_idle(engine, engine_client, clock, pause, bounds)
    if stop is not Stop.EXITED:
        log.warning(
            "engine still running %.1f s after SIGTERM, at the %s%s: SIGKILL",
            clock.monotonic() - terminated,
            stop.value,
            _why(stop, bounds),
        )
    engine.kill()  # the group: children of an engine that exited may remain
    await reap(engine)
    return stop


def _why(stop: Stop, bounds: StopBounds) -> str:
    if stop is Stop.STARTING_GRACE:
        return f" ({bounds.starting_grace_s:g} s: it never became ready, so it accepted nothing)"
    if stop is Stop.IDLE_GRACE:
        return f" ({bounds.idle_exit_grace_s:g} s idle)"
    return ""


async def _await_exit(
    engine: EngineHandle, clock: Clock, pause: Callable[[float], Awaitable[None]], bounds: StopBounds, until: float
) -> Stop:
    """Until the engine exits, or ``until`` or the deadline passes (no scrape: a starting engine has nothing in
    flight)."""
    stop, kill_at = (Stop.STARTING_GRACE, until) if until < bounds.deadline else (Stop.DEADLINE, bounds.deadline)
    while engine.returncode is None:
        now = clock.monotonic()
        if now >= kill_at:
            return stop
        await pause(kill_at - now)
    return Stop.EXITED


async def _await_engine_idle(
    engine: EngineHandle,
    engine_client: EngineClient,
    clock: Clock,
    pause: Callable[[float], Awaitable[None]],
    bounds: StopBounds,
) -> Stop:
    """Until the engine exits, or is idle for ``idle_exit_grace_s``, or the deadline passes."""
    idle_since: float | None = None
    while engine.returncode is None:
        if clock.monotonic() >= bounds.deadline:
            return Stop.DEADLINE
        in_flight = await _in_flight(engine_client)
        now = clock.monotonic()
        if in_flight == 0 and idle_since is None:
            idle_since = now
        elif in_flight is not None and in_flight > 0:
            idle_since = None
        if idle_since is not None and now - idle_since >= bounds.idle_exit_grace_s:
            return Stop.IDLE_GRACE
        idle_end = math.inf if idle_since is None else idle_since + bounds.idle_exit_grace_s
        await pause(max(0.0, min(bounds.poll_s, bounds.deadline - now, idle_end - now)))
    return Stop.EXITED


async def _in_flight(engine_client: EngineClient) -> float | None:
    """Running + waiting from the engine's /metrics; None when the scrape fails."""
    with contextlib.suppress(Exception):
        metrics = EngineMetrics.from_text(await engine_client.metrics())
        return metrics.running + metrics.waiting
    return None


async def reap(engine: EngineHandle) -> None:
    """Wait (up to 10 s) for a killed engine's exit status."""
    # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation racing the result.
    waiter = asyncio.ensure_future(engine.wait())
    try:
        await asyncio.wait({waiter}, timeout=10.0)
    finally:
        waiter.cancel()
