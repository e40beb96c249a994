"""The simulation's control step: the live loop's decision step (`control_plane.scaling.step.decide`) on simulated
reports.

The simulator hands it what the control plane would hold at a tick: one `ReplicaLoad` per replica (its last
scrape, or ``launching``) and the gateway's last report. It keeps the policy state and the demand window between
ticks exactly as `control_plane.loop.ControlLoop` does, so a report sequence gets the same decisions here and live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from control_plane.loop import node_lead, planned_qps
from control_plane.reports import GatewaySeen, gateway_demand
from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision
from control_plane.scaling.policies import ScalingPolicy, make_policy
from control_plane.scaling.step import DemandHistory, ScalingState, decide
from fleet.capacity.paid_floor import PaidFloor, paid_floor
from fleet.protocol.wire import GatewayReport
from fleet.spec.stack import AutoscalingSpec, FleetSpec, PoolSpec

__all__ = ["Controller"]


@dataclass
class Controller:
    """One pool's scaler: ``step(now, replicas, gateway)`` -> the decision the live loop would take."""

    pool: PoolSpec
    autoscaling: AutoscalingSpec
    policy: ScalingPolicy
    per_replica_qps: float | None
    stale_after_s: float
    gateway_reports: bool = True  # the gateway's queue and request rate reach the scaler
    node_lead_s: float = 0.0  # the live loop's `node_lead`, so decisions (nodes_for included) stay the same
    paid: PaidFloor | None = None  # the live loop's paid floor (`fleet.capacity.paid_floor.paid_floor`)
    # on a shared group, the floor of each tick, moved by the group's claims (`simulate.shared`); None: ``paid``
    paid_now: Callable[[], PaidFloor | None] | None = None
    last: Decision | None = None  # the last step's decision, the claim the group reads
    state: ScalingState = field(default_factory=ScalingState)
    demand: DemandHistory = ()

    @classmethod
    def for_pool(
        cls,
        spec: FleetSpec,
        pool: PoolSpec,
        *,
        gateway_reports: bool = True,
        autoscaling: AutoscalingSpec | None = None,
    ) -> Controller:
        """The scaler ``autoscaling`` (default: the stack's ``autoscaling``: policy, predictive) configures."""
        autoscaling = autoscaling or spec.autoscaling
        return cls(
            pool=pool,
            autoscaling=autoscaling,
            policy=make_policy(autoscaling.policy.name, autoscaling.policy.params),
            per_replica_qps=planned_qps(spec, pool) if gateway_reports else None,
            stale_after_s=spec.control_plane.stale_after_s,
            gateway_reports=gateway_reports,
            node_lead_s=node_lead(spec, pool),
            paid=paid_floor(spec, pool),
        )

    def step(self, now: float, replicas: tuple[ReplicaLoad, ...], gateway: GatewayReport | None = None) -> Decision:
        seen: list[GatewaySeen] = []
        if self.gateway_reports and gateway is not None:
            age = max(0.0, now - gateway.ts)
            seen.append(GatewaySeen(gateway, gateway.ts, age, age > self.stale_after_s))
        step = decide(
            self.pool,
            self.autoscaling,
            self.policy,
            replicas,
            now,
            gateway=gateway_demand(seen),
            per_replica_qps=self.per_replica_qps,
            demand_history=self.demand,
            state=self.state,
            node_lead_s=self.node_lead_s,
            paid=self.paid if self.paid_now is None else self.paid_now(),
        )
        self.state, self.demand, self.last = step.state, step.demand_history, step.decision
        return step.decision
