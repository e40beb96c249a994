"""Clock: the agent's only source of time, injected so the supervisor runs under a fake clock in tests."""

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
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
