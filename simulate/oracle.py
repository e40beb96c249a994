"""Oracle scaler: the scaling configuration that reads the trace and orders capacity exactly a start time ahead.

Type ``oracle`` · a scaling configuration of the simulator (a row of `llmfleet simulate --compare scaling`),
replayed through the same `simulate.fleet_sim.FleetSim` as every other one.

What it does. Cut the trace into intervals of ``ORACLE_INTERVAL_S`` (10 s). Interval i needs
``n_i = max(min, ceil(arrivals_i / (per_replica_qps x 10 s)))`` replicas (`simulate.bounds.needed_replicas`,
at the capacity plan's at-SLO rate for the trace's token mix). At a control tick at ``t`` the oracle wants

* ``replicas(t) = min(max, max n_j over the intervals j that [t, t + coldStartSeconds + tick] touches)``:
  every replica is launched its own cold start ahead of the interval that needs it (one tick more, since a
  launch waits for the next tick), and kept through a gap shorter than a cold start, because a replica stopped
  then could not be back in time;
* ``nodes_for(t)``: the same with ``nodeColdStartSeconds`` more look-ahead (`control_plane.loop.node_lead`: the
  node start under the ``aws`` actuator, else 0), so each node is ordered its node start before its replicas.

It scales down to ``replicas(t)`` at once (no stabilisation window: it knows the next need), launching replicas
first, then the least loaded. The pool starts with ``replicas(0)`` ready: the oracle ordered them before the
trace began. `oracle_targets` is the whole policy, a pure function of the need (`simulate.bounds.lookahead`, the
look-ahead the node bound reads the need with, within the pool's bounds); `OracleScaler` only turns its value at
a tick into the decision the simulator carries out.

Inputs consumed: the trace (through the need), the pool's replica bounds and cold start, the node lead; it
reads no report. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision, Hold, ScaleDown, ScaleUp
from fleet.protocol.wire import GatewayReport, ReplicaState
from simulate.bounds import lookahead

__all__ = ["ORACLE_INTERVAL_S", "OracleScaler", "oracle_targets"]

ORACLE_INTERVAL_S = 10.0  # the need the oracle meets: every 10 s, the length of the traces' bursts


def oracle_targets(
    needed: Sequence[int], interval_s: float, lead_s: float, min_replicas: int, max_replicas: int
) -> list[int]:
    """The oracle's replicas per interval: `lookahead` of ``needed`` by ``lead_s``, within the pool's bounds."""
    return [min(max_replicas, max(min_replicas, n)) for n in lookahead(needed, interval_s, lead_s)]


@dataclass(frozen=True)
class OracleScaler:
    """Replicas (and node room) per ``interval_s`` computed ahead from the trace; ``step`` reads them off."""

    pool: str
    replicas: tuple[int, ...]  # per interval, from `oracle_targets` with the replica lead
    nodes_for: tuple[int, ...]  # per interval, the same with the node lead added
    interval_s: float = ORACLE_INTERVAL_S

    @classmethod
    def for_need(
        cls,
        pool: str,
        needed: Sequence[int],
        *,
        cold_start_s: float,
        tick_s: float,
        node_lead_s: float,
        bounds: tuple[int, int],
        interval_s: float = ORACLE_INTERVAL_S,
    ) -> OracleScaler:
        lo, hi = bounds
        lead = cold_start_s + tick_s
        return cls(
            pool,
            tuple(oracle_targets(needed, interval_s, lead, lo, hi)),
            tuple(oracle_targets(needed, interval_s, lead + node_lead_s, lo, hi)),
            interval_s,
        )

    def target(self, now: float) -> tuple[int, int]:
        """(replicas, nodes_for) the oracle wants at ``now``; after the trace, the pool's last value."""
        if not self.replicas:
            return 0, 0
        i = min(len(self.replicas) - 1, max(0, int(now // self.interval_s)))
        return self.replicas[i], self.nodes_for[i]

    def step(self, now: float, replicas: tuple[ReplicaLoad, ...], gateway: GatewayReport | None = None) -> Decision:
        del gateway  # Unused: the oracle reads the trace, not the reports.
        active = [r for r in replicas if r.state in (ReplicaState.LAUNCHING, ReplicaState.READY)]
        want, room = self.target(now)
        current = len(active)
        if want > current:
            reason = "the trace needs them a cold start from now"
            return ScaleUp(self.pool, current, want, reason, now, policy="oracle", nodes_for=room)
        if want < current:
            # Launching replicas first (they serve nobody yet), then the least loaded ready ones.
            order = sorted(active, key=lambda r: (r.state != ReplicaState.LAUNCHING, r.load, r.replica))
            victims = tuple(r.replica for r in order[: current - want])
            reason = "no interval within a cold start needs them"
            return ScaleDown(self.pool, current, want, reason, now, policy="oracle", nodes_for=room, victims=victims)
        return Hold(self.pool, current, want, "as the trace needs", now, policy="oracle", nodes_for=room)
