"""Drain: stop one engine within the pod's drain grace, letting accepted requests finish.

Readiness has already fallen when this runs. From ``ready``, gateways still route here until they see that,
so the engine keeps serving for ``drain.propagationSeconds`` first. Then SIGTERM (the engine's own
``--shutdown-timeout`` lets accepted requests finish), wait until the engine exits, or reports running +
waiting = 0 for ``idle_exit_grace_s``, or the deadline passes, and SIGKILL the process group after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from agent.engine_client import EngineClient
from agent.launchers import EngineHandle
from fleet.protocol.clock import Clock
from fleet.protocol.promtext import EngineMetrics

__all__ = ["reap", "stop_engine"]

log = logging.getLogger(__name__)


async def stop_engine(
    engine: EngineHandle,
    engine_client: EngineClient,
    clock: Clock,
    pause: Callable[[float], Awaitable[None]],
    *,
    propagation_s: float | None,
    deadline: float,
    idle_exit_grace_s: float,
    poll_s: float,
) -> None:
    """Serve on for ``propagation_s`` (None when no gateway routed here), SIGTERM, wait for the exit or idleness
    until ``deadline`` (monotonic), SIGKILL, reap. ``pause`` is the supervisor's wakeable sleep."""
    if propagation_s is not None:
        await clock.sleep(propagation_s)
    engine.terminate()
    await _await_engine_idle(engine, engine_client, clock, pause, deadline, idle_exit_grace_s, poll_s)
    if engine.returncode is None:
        log.warning("engine still running at the drain deadline: SIGKILL")
    engine.kill()
    await reap(engine)


async def _await_engine_idle(
    engine: EngineHandle,
    engine_client: EngineClient,
    clock: Clock,
    pause: Callable[[float], Awaitable[None]],
    deadline: float,
    idle_exit_grace_s: float,
    poll_s: float,
) -> None:
    """Until the engine exits, or is idle for ``idle_exit_grace_s``, or the deadline passes."""
    idle_since: float | None = None
    while engine.returncode is None and clock.monotonic() < deadline:
        in_flight: float | None = None
        with contextlib.suppress(Exception):
            metrics = EngineMetrics.from_text(await engine_client.metrics())
            in_flight = metrics.running + metrics.waiting
        now = clock.monotonic()
        if in_flight == 0:
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= idle_exit_grace_s:
                return
        else:
            idle_since = None
        await pause(min(poll_s, max(0.0, deadline - now)))


async def reap(engine: EngineHandle) -> None:
    """Wait (up to 10 s) for a killed engine's exit status."""
    # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation racing the result.
    waiter = asyncio.ensure_future(engine.wait())
    try:
        await asyncio.wait({waiter}, timeout=10.0)
    finally:
        waiter.cancel()
