"""Rollover: when one replica may take its planned restart, and the control-plane lease that allows it.

A replica is due inside its pool's restart window, past its minimum uptime (`agent.windows.restart_due`).
Each window occurrence is handled at most once: a granted lease, or an unreachable control plane (the
occurrence is skipped: no lease, no restart), marks it handled. A refused lease (409: the pool already has
``maxUnavailable`` replicas restarting) is asked for again after ``lease_retry_s`` x a jitter in [0.5, 1.5),
for as long as the occurrence stays open. The lease lives ``drain.graceSeconds + coldStartSeconds + 60`` s, so
an agent that dies mid-restart cannot block its pool for longer; `Rollover.release` hands it back early once the
restarted engine is ready (or the replica stops for good).

The supervisor owns the state machine; this module only answers "begin the planned restart now?" and keeps
the lease bookkeeping. Control client, clock, metrics and randomness are injected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from agent.control import ControlClient, ControlPlaneUnavailable, LeaseRefused
from agent.metrics import AgentMetrics
from agent.windows import restart_due
from fleet.protocol.clock import Clock
from fleet.spec.stack import PoolSpec

__all__ = ["Rollover"]

log = logging.getLogger(__name__)


class Rollover:
    """Restart-window and lease state of one replica. ``held`` is True from a grant until `release`."""

    def __init__(
        self,
        pool: PoolSpec,
        replica: str,
        control: ControlClient,
        clock: Clock,
        metrics: AgentMetrics,
        lease_retry_s: float,
        rand: Callable[[], float],
    ) -> None:
        self.pool = pool
        self.replica = replica
        self._control = control
        self._clock = clock
        self._metrics = metrics
        self._lease_retry_s = lease_retry_s
        self._rand = rand
        self.held = False
        self._handled_window: datetime | None = None
        self._next_lease_try = 0.0

    async def acquire(self, uptime_s: float) -> bool:
        """Inside an unhandled window occurrence, ask for a restart lease; True when it was granted (now held)."""
        now = datetime.fromtimestamp(self._clock.time(), UTC)
        occurrence = restart_due(self.pool.restart_window, now, uptime_s)
        if occurrence is None or occurrence == self._handled_window:
            return False
        if self._clock.monotonic() < self._next_lease_try:
            return False
        try:
            await self._control.acquire_lease(self.pool.name, self.replica, self._ttl_s())
        except LeaseRefused:
            self._metrics.leases.labels("refused").inc()
            jitter = 0.5 + self._rand()
            self._next_lease_try = self._clock.monotonic() + self._lease_retry_s * jitter
            return False
        except ControlPlaneUnavailable as exc:
            self._metrics.leases.labels("unavailable").inc()
            log.warning("restart window skipped: no control plane to grant a lease (%s)", exc)
            self._handled_window = occurrence
            return False
        self._metrics.leases.labels("granted").inc()
        self._handled_window = occurrence
        self.held = True
        return True

    def _ttl_s(self) -> float:
        """One drain and one cold start, with a minute to spare."""
        return self.pool.drain.grace_seconds + self.pool.cold_start_seconds + 60.0

    async def renew(self) -> None:
        """While the held lease's restart takes another start (the last one failed or timed out), renew it for one
        more: otherwise it expires mid-restart and the next replica's lease takes a second replica of the pool down
        with this one (seen on real vLLM, whose start under load can outlast its cold start). A refused or failed
        renewal is logged; the restart goes on."""
        if not self.held:
            return
        try:
            await self._control.acquire_lease(self.pool.name, self.replica, self._ttl_s())
        except (LeaseRefused, ControlPlaneUnavailable) as exc:
            log.warning("restart lease not renewed (it may expire before this restart ends): %s", exc)

    async def release(self) -> None:
        """Hand the lease back (a failed release is only logged: the lease expires on its own)."""
        self.held = False
        try:
            await self._control.release_lease(self.pool.name, self.replica)
        except ControlPlaneUnavailable as exc:
            log.warning("lease release failed (it will expire): %s", exc)
