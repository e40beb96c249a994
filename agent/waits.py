"""Waits: the supervisor's interruptible waits on the injected clock.

A command (drain, reset) or the engine exiting must not wait out a probe interval or a backoff, and a final
drain must not wait for a health check or a model fetch to finish. `Waits.pause` sleeps until the clock says
so or `wake` is called; `Waits.unless_drained` gives up on an awaitable once `drain` was called, and says so
with `INTERRUPTED` rather than a value of the awaited type.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable
from typing import Final, Literal, TypeVar

from fleet.protocol.clock import Clock

__all__ = ["INTERRUPTED", "Interrupted", "Waits"]

T = TypeVar("T")


class Interrupted(enum.Enum):
    """What `Waits.unless_drained` returns when a final drain cut the call short."""

    TOKEN = "interrupted"


INTERRUPTED: Final = Interrupted.TOKEN


class Waits:
    """A wake signal for pauses and a drain signal for calls; both are set from synchronous commands."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()

    def wake(self) -> None:
        """End the current (or the next) pause early."""
        self._wake.set()

    def drain(self) -> None:
        """From now on every `unless_drained` call returns `INTERRUPTED` at once."""
        self._drained.set()

    async def pause(self, seconds: float) -> None:
        """Sleep on the injected clock; `wake` ends it early (a wake that came first ends it at once)."""
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

    async def unless_drained(self, call: Awaitable[T]) -> T | Literal[Interrupted.TOKEN]:
        """Await ``call`` but give up (cancelling it, returning `INTERRUPTED`) as soon as `drain` is called."""
        task = asyncio.ensure_future(call)
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({task, drained}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait({task})
        return INTERRUPTED
