"""Clock: the agent takes the shared `fleet.clock.Clock` (re-exported for its modules)."""

from __future__ import annotations

from fleet.clock import Clock, SystemClock

__all__ = ["Clock", "SystemClock"]
