"""Measured starts: how long each pool's replicas really take to serve, from the phases their agents report.

Each load report carries the engine's current or last start (`fleet.protocol.wire.StartPhases`: the agent's model
fetch, then launch to the engine's first healthy ``/health``, with the load, compile and graph-capture phases the
engine logged). A start counts once its ``ready_s`` is known, once per (replica, start): its seconds are the fetch
plus the launch-to-ready. Kept per pool, the last `KEPT` of them, so ``GET /v1/pools`` and ``llmfleet status`` set
the measured start beside ``coldStartSeconds``, the figure the scaler leads by, and the control plane logs when
the median start is longer than it: the scaler then orders replicas too late for a ramp.

What this does not see: the image pull and the pod's scheduling before the agent runs (the kubelet's
``kubelet_image_pull_duration_seconds`` and the pod's events hold those), and a new node's boot (the group's
``nodeColdStartSeconds``).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from fleet.protocol.pools_wire import MeasuredStarts
from fleet.protocol.wire import LoadReport, StartPhases

__all__ = ["KEPT", "SLOWER_THAN_CONFIGURED", "StartLedger"]

log = logging.getLogger("llmfleet.control_plane.starts")

KEPT = 20  # starts kept per pool: enough for a median that one slow node does not move
SLOWER_THAN_CONFIGURED = 1.2  # a median start this much longer than coldStartSeconds is logged


def start_seconds(start: StartPhases) -> float | None:
    """The start's seconds to serve: its fetch plus launch to ready; None while it is not ready yet."""
    if start.ready_s is None:
        return None
    return (start.fetch_s or 0.0) + start.ready_s


@dataclass
class StartLedger:
    """The last `KEPT` measured starts of each pool, each counted once."""

    # pool -> ((replica, started_at), seconds, phases), oldest first
    kept: dict[str, deque[tuple[tuple[str, float], float, StartPhases]]] = field(default_factory=dict)
    warned: dict[str, float] = field(default_factory=dict)

    def record(self, report: LoadReport, cold_start_s: float) -> bool:
        """Count the report's start if it is ready and new; True when it was counted."""
        start = report.start
        seconds = None if start is None else start_seconds(start)
        if start is None or seconds is None:
            return False
        key = (report.replica, start.started_at)
        starts = self.kept.setdefault(report.pool, deque(maxlen=KEPT))
        if any(k == key for k, _, _ in starts):
            return False  # every report repeats the last start until the next one
        starts.append((key, seconds, start))
        self._check(report.pool, cold_start_s)
        return True

    def summary(self, pool: str, cold_start_s: float) -> MeasuredStarts | None:
        """The pool's measured starts beside its ``coldStartSeconds``; None before the first one."""
        starts = self.kept.get(pool)
        if not starts:
            return None
        ordered = sorted(seconds for _, seconds, _ in starts)
        return MeasuredStarts(
            count=len(ordered),
            p50_s=round(ordered[(len(ordered) - 1) // 2], 3),
            max_s=round(ordered[-1], 3),
            cold_start_s=cold_start_s,
            last=starts[-1][2],
        )

    def _check(self, pool: str, cold_start_s: float) -> None:
        summary = self.summary(pool, cold_start_s)
        assert summary is not None
        slow = summary.p50_s > cold_start_s * SLOWER_THAN_CONFIGURED
        if slow and self.warned.get(pool) != summary.p50_s:
            self.warned[pool] = summary.p50_s
            log.warning(
                "pool %s: its replicas' median start is %.0f s over %d starts, coldStartSeconds says %.0f s: the "
                "scaler orders replicas too late; set coldStartSeconds to what they measure",
                pool,
                summary.p50_s,
                summary.count,
                cold_start_s,
            )
