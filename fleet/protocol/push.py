"""Push: the cadence of background reports to the control plane, backing off while pushes fail.

Used by the agent's load reports (`agent.reporter`) and the gateway's reports (`gateway.reporting`). Contract:

* `Backoff` counts consecutive failed pushes (`record`) and gives the wait before the next one (`delay`):
  ``interval_s`` while pushes succeed; after n failures in a row ``min(max_s, interval_s x 2^(n-1))``, so the
  first retry comes at the usual interval (one lost push is usually a blip) and the waits double from there.
  With ``jitter`` j > 0 the wait is scaled by a factor drawn uniformly from [1 - j, 1 + j] through the injected
  ``rand`` (a function returning [0, 1)), so many reporters that lost the control plane together do not retry
  in lockstep. One success resets the count.
* `push_loop` calls ``push`` forever, waiting ``delay()`` on the injected `fleet.protocol.clock.Clock` between calls, or
  less when ``wake`` is set (a change the control plane should learn now). ``push`` never raises for a failed
  push: it records the outcome on the `Backoff` itself, so it can also run alone (at start, in tests).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fleet.protocol.clock import Clock

__all__ = ["Backoff", "push_loop"]

# Past 2^30 x interval every cap is reached; the bound keeps the float finite after a very long outage.
_MAX_DOUBLINGS = 30


@dataclass
class Backoff:
    """The wait between pushes, from the number of consecutive failures (see the module docstring)."""

    interval_s: float
    max_s: float
    jitter: float = 0.0
    rand: Callable[[], float] = field(default=random.random, repr=False)
    failures: int = 0  # consecutive failed pushes

    def record(self, ok: bool) -> int:
        """Count one push's outcome; returns the failures in a row before it (0: pushes were succeeding)."""
        before = self.failures
        self.failures = 0 if ok else before + 1
        return before

    def delay(self) -> float:
        """Seconds to wait before the next push."""
        if self.failures == 0:
            wait = self.interval_s
        else:
            wait = min(self.max_s, self.interval_s * 2.0 ** min(self.failures - 1, _MAX_DOUBLINGS))
        if self.jitter:
            wait *= 1.0 + self.jitter * (2.0 * self.rand() - 1.0)
        return wait


async def push_loop(
    push: Callable[[], Awaitable[object]], backoff: Backoff, clock: Clock, wake: asyncio.Event | None = None
) -> None:
    """Run ``push`` then wait ``backoff.delay()`` (or until ``wake`` is set, which is then cleared), forever."""
    while True:
        await push()
        if wake is None:
            await clock.sleep(backoff.delay())
            continue
        sleeper = asyncio.ensure_future(clock.sleep(backoff.delay()))
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            woken.cancel()
        wake.clear()
