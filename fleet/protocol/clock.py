"""Clock: the fleet's time protocol: by convention a part that reads or waits on time takes a `Clock`.

Injected so tests and simulations run on fake time. In fleet/ `fleet.protocol.push.push_loop` and
`fleet.protocol.control_auth.TokenReview` take one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for intervals and deadlines."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (restart windows, report timestamps)."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
