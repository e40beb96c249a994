"""Sleeping: put the engine to sleep at level 1 and wake it, checking after every wake that it answers as before.

Only level 1 (weights copied to host memory, KV cache discarded): a level-2 wake gives garbage weights until they
are reloaded. vLLM queues, not refuses, a request that arrives while it sleeps, so the replica leaves routing
first: readiness has already fallen (the state is ``sleeping``) when `SleepCycle.fall_asleep` runs, which then

1. keeps serving for ``drain.propagationSeconds`` while gateways and the control plane notice;
2. waits until the engine reports running + waiting = 0, at most ``drain`` 's shutdown timeout (what is still in
   flight after that is aborted by the sleep, vLLM's default ``mode=abort``);
3. asks the greedy check (`agent.engine_client.check_body`) and keeps its answer as the reference;
4. sends ``POST /sleep?level=1``.

`SleepCycle.wake` sends ``POST /wake_up`` and asks the check again: the same text as the reference, or the wake
failed (`WakeOutcome`), and the supervisor restarts the engine cold. Each step gives up, before anything is sent
to the engine, once ``still`` says the supervisor moved on (a drain, or a wake asked before the sleep was sent).
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.engine_client import EngineClient
from fleet.protocol.clock import Clock
from fleet.protocol.promtext import EngineMetrics

__all__ = ["SLEEP_LEVEL", "SleepCycle", "SleepOutcome", "WakeOutcome"]

log = logging.getLogger(__name__)

SLEEP_LEVEL = 1


class SleepOutcome(enum.Enum):
    ASLEEP = "asleep"
    NOT_SENT = "not_sent"  # the supervisor moved on before the sleep was sent: the engine is awake and serving
    FAILED = "failed"  # the check before the sleep, or the sleep itself, failed


class WakeOutcome(enum.Enum):
    AWAKE = "awake"  # awake, and the check answered as before the sleep
    FAILED = "failed"  # /wake_up or the check request failed
    MISMATCH = "mismatch"  # the check answered other tokens than before the sleep


@dataclass
class SleepCycle:
    """One engine's sleeps and wakes; ``asleep`` is True between a sleep the engine confirmed and the next wake."""

    engine: EngineClient
    clock: Clock
    pause: Callable[[float], Awaitable[None]]  # the supervisor's wakeable sleep
    propagation_s: float
    idle_timeout_s: float
    poll_s: float = 0.25
    asleep: bool = False
    reference: str | None = None  # the check's answer before the last sleep
    woken_with: str | None = None  # the check's answer after the last wake

    def forget(self) -> None:
        """A new engine process: nothing of the old one's sleep applies."""
        self.asleep, self.reference, self.woken_with = False, None, None

    async def fall_asleep(self, still: Callable[[], bool]) -> SleepOutcome:
        """Leave routing, settle in-flight requests, record the reference answer, sleep (module docstring)."""
        until = self.clock.monotonic() + self.propagation_s
        while still() and self.clock.monotonic() < until:
            await self.pause(until - self.clock.monotonic())
        await self._until_idle(still, self.clock.monotonic() + self.idle_timeout_s)
        if not still():
            return SleepOutcome.NOT_SENT
        reference = await self.engine.check()
        if reference is None:
            log.error("the check request failed before sleeping")
            return SleepOutcome.FAILED
        if not still():
            return SleepOutcome.NOT_SENT
        if not await self.engine.sleep(SLEEP_LEVEL):
            log.error("POST /sleep?level=%d failed", SLEEP_LEVEL)
            return SleepOutcome.FAILED
        self.asleep, self.reference = True, reference
        log.info("engine asleep (level %d)", SLEEP_LEVEL)
        return SleepOutcome.ASLEEP

    async def _until_idle(self, still: Callable[[], bool], deadline: float) -> None:
        while still() and self.clock.monotonic() < deadline:
            with contextlib.suppress(Exception):  # an unreadable scrape: ask again
                metrics = EngineMetrics.from_text(await self.engine.metrics())
                if metrics.running + metrics.waiting == 0:
                    return
            await self.pause(min(self.poll_s, max(0.0, deadline - self.clock.monotonic())))
        if still():
            log.warning("requests still in flight after %.1f s: the sleep aborts them", self.idle_timeout_s)

    async def wake(self) -> WakeOutcome:
        """Wake the engine and compare the check's answer with the one before the sleep."""
        started = self.clock.monotonic()
        if not await self.engine.wake_up():
            return WakeOutcome.FAILED
        self.asleep = False
        answer = await self.engine.check()
        self.woken_with = answer
        if answer is None:
            return WakeOutcome.FAILED
        if answer != self.reference:
            log.error("after the wake the check answered %r, before the sleep %r", answer, self.reference)
            return WakeOutcome.MISMATCH
        log.info("engine awake and checked in %.3f s", self.clock.monotonic() - started)
        return WakeOutcome.AWAKE
