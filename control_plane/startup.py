"""StartupHold: a control plane that has just started decides nothing until the agents alive have reported.

A control plane keeps no replica registry across a restart: it rebuilds it from the agents' load reports. Until
every agent alive has reported again, its registry is missing replicas that serve, and a scaling decision or a
discovery answer made from it would be wrong: replicas launched twice, gateways told to forget replicas that serve.

How long that takes: an agent whose pushes failed while the control plane was away waits ``min(cap, interval x
2^(n-1))`` between tries (`fleet.protocol.push.Backoff`, cap = the agent's ``--report-backoff-max``, 10 s by default),
so
after an outage of more than a few intervals its next report can come up to the cap after the control plane is
back: later than ``staleAfterS`` (5 s by default). Measured on the local fleet (report interval 0.25 s, stale
limit 2 s, control plane away ~1 s): the agents reported again 2.8 s after the restart; a hold of the stale limit
alone made the restarted control plane answer gateways with an empty replica list, and they queued requests
until the agents were back.

A pool is *settled*, and may be scaled and listed to gateways, once either holds:

* ``hold_s`` has passed since the start (`hold_for`: the longest an agent that is alive stays silent, its report
  interval or the backoff cap, plus one report interval, and never less than ``staleAfterS``), or
* the actuator names the pool's replicas (the local actuator, after adopting its agents) and each of them has
  reported: nothing is left to wait for. A first start with no agents settles at once this way.

Once settled a pool stays settled. ``hold_s`` 0 turns the hold off (tests that drive the loop by hand).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from fleet.spec.stack import FleetSpec

__all__ = ["AGENT_REPORT_BACKOFF_MAX_S", "StartupHold", "hold_for"]

AGENT_REPORT_BACKOFF_MAX_S = 10.0  # the agent's --report-backoff-max default (a test holds the two together)


def hold_for(spec: FleetSpec, report_backoff_max_s: float = AGENT_REPORT_BACKOFF_MAX_S) -> float:
    """The longest a started control plane waits for the agents alive to report (see the module docstring)."""
    interval = spec.control_plane.report_interval_s
    return max(spec.control_plane.stale_after_s, max(interval, report_backoff_max_s) + interval)


@dataclass
class StartupHold:
    started_at: float
    hold_s: float
    _settled: set[str] = field(default_factory=set)

    def remaining(self, now: float) -> float:
        """Seconds of the hold left at ``now`` (0 once it has passed)."""
        return max(0.0, self.started_at + self.hold_s - now)

    def settled(self, pool: str, now: float) -> bool:
        """Whether ``pool`` is settled at ``now`` (by time, or by an earlier `settle`)."""
        return pool in self._settled or self.remaining(now) <= 0

    def settle(self, pool: str, now: float, expected: Collection[str] | None, reported: Collection[str]) -> bool:
        """`settled`, also settling ``pool`` when every replica in ``expected`` (None: the actuator cannot name
        them) is in ``reported``."""
        if not self.settled(pool, now) and expected is not None and set(expected) <= set(reported):
            self._settled.add(pool)
        return self.settled(pool, now)
