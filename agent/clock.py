"""Clock: the agent takes the shared `fleet.protocol.clock.Clock` (re-exported for its modules)."""

from __future__ import annotations

from fleet.protocol.clock import Clock, SystemClock

__all__ = ["Clock", "SystemClock"]
