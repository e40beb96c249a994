"""ControlLoop: every ``autoscaling.intervalS``, turn each pool's reports into a decision and act on it.

    reports (registry) + gateway reports + actuator view -> control_plane.scaling.step.decide -> Decision -> actuator

`control_plane.scaling.step.decide` (context, demand window, policy, guard-rails) is the one decision step; the fleet
simulation calls it too, so a simulated pool is scaled by exactly this code.

``tick(now)`` is one pass and returns the decisions, so tests drive it with explicit times; ``run()`` repeats it
until ``stop()``. The decision log keeps every scale-up and scale-down and each change of reason while holding.
Each tick first judges the running canary rollouts (`control_plane.rollouts`), whose decisions join the log.
Each pool's departures are carried from tick to tick (`control_plane.scaling.departures`): a replica that died is
replaced once, and the pool does not shrink while its replacement starts.

With ``startup_hold_s`` > 0 (the control plane's CLI passes `control_plane.startup.hold_for`) a pool is held, and its
actuator neither applies nor reconciles anything, until the pool is settled (`control_plane.startup.StartupHold`):
a restarted control plane first hears from the agents that are alive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import asdict

from control_plane.actuators import Actuator, FleetView
from control_plane.reports import GatewayRegistry, ReplicaRegistry, ReplicaSeen, gateway_demand
from control_plane.rollouts import Rollouts
from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision, Hold, ScaleDown, claim_of
from control_plane.scaling.departures import Departures, observe
from control_plane.scaling.policies import make_policy
from control_plane.scaling.step import DemandHistory, ScalingState, decide, pick_victims
from control_plane.startup import StartupHold
from fleet.capacity.paid_floor import PaidFloor, paid_floor
from fleet.capacity.plan import plan_pool
from fleet.protocol.clock import Clock
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["ControlLoop", "gateway_demand", "node_lead", "pick_victims", "planned_qps"]

log = logging.getLogger("llmfleet.autoscaler.loop")


def _gist(reason: str) -> str:
    """A reason without its figures: holds are logged when the gist changes, not every tick's numbers."""
    return "".join(ch for ch in reason if not (ch.isdigit() or ch == "."))


def _load(seen: ReplicaSeen) -> ReplicaLoad:
    r = seen.report
    return ReplicaLoad(
        replica=r.replica,
        state=r.state,
        stale=seen.stale,
        waiting=r.waiting,
        running=r.running,
        kv_usage=r.kv_usage,
        ttft_p99_s=r.ttft_p99_s,
        tokens_per_s=r.tokens_per_s,
        report_age_s=round(seen.age_s, 3),
    )


def planned_qps(spec: FleetSpec, pool: PoolSpec) -> float | None:
    """The pool's planned at-SLO requests/s per replica, None when the plan cannot say (no positive figure)."""
    try:
        qps = plan_pool(spec, pool).per_replica_qps
    except (KeyError, ValueError) as exc:
        log.warning("pool %s: no capacity plan (%s); the request-rate term is off", pool.name, exc)
        return None
    return qps if qps > 0 else None


def node_lead(spec: FleetSpec, pool: PoolSpec) -> float:
    """How much longer than its cold start a replica takes when it needs a new node: its GPU group's
    ``nodeColdStartSeconds`` under the ``aws`` actuator (which grows node groups), else 0."""
    if spec.autoscaling.actuator != "aws" or pool.node_group is None:
        return 0.0
    return spec.node_group(pool.node_group).node_cold_start_seconds


class ControlLoop:
    """One control loop over every engine pool of ``spec`` (a disaggregated pool's prefill role pool is scaled like a
    pool, within its own bounds), built complete: ``restarting(pool, now)`` names the replicas
    holding a restart lease (their agents drain them for a planned restart, so they come back: counted as capacity
    on its way, never replaced or removed); ``rollouts`` are the canary rollouts judged each tick (a baseline
    promoted away from may be sized down to no replica); ``decisions`` is the decision log, shared with whoever
    else logs to it (None: a fresh one of ``history`` entries)."""

    def __init__(
        self,
        spec: FleetSpec,
        registry: ReplicaRegistry,
        actuator: Actuator,
        clock: Clock,
        history: int = 500,
        gateways: GatewayRegistry | None = None,
        startup_hold_s: float = 0.0,
        *,
        restarting: Callable[[str, float], Collection[str]] = lambda pool, now: (),
        rollouts: Rollouts | None = None,
        decisions: deque[Decision] | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.gateways = gateways or GatewayRegistry(registry.stale_after_s, registry.forget_after_s)
        self.per_replica_qps = {p.name: planned_qps(spec, p) for p in spec.engine_pools}
        self.node_lead_s = {p.name: node_lead(spec, p) for p in spec.engine_pools}
        self.actuator = actuator
        self.clock = clock
        self.policy = make_policy(spec.autoscaling.policy.name, spec.autoscaling.policy.params)
        self.decisions: deque[Decision] = deque(maxlen=history) if decisions is None else decisions
        self.last: dict[str, Decision] = {}
        self._state: dict[str, ScalingState] = {}
        self._demand: dict[str, DemandHistory] = {}
        self._departures: dict[str, Departures] = {}
        self._stop = asyncio.Event()
        self.startup = StartupHold(clock.time(), startup_hold_s)
        self.restarting = restarting
        self.rollouts = rollouts

    def replicas(self, pool: PoolSpec, view: FleetView, now: float) -> tuple[ReplicaLoad, ...]:
        """Merge the actuator's view with the registry: the actuator says which replicas exist (when it can),
        the reports say how they are doing; a launched replica with no report yet is 'launching'."""
        holders = set(self.restarting(pool.name, now))
        seen = {s.report.replica: s for s in self.registry.seen(pool.name, now)}

        def load(s: ReplicaSeen) -> ReplicaLoad:
            found = _load(s)
            if found.state == ReplicaState.DRAINING and found.replica in holders:  # a planned restart, not a departure
                return dataclasses.replace(found, state=ReplicaState.RESTARTING)
            return found

        if view.replicas is not None:
            return tuple(load(seen[r]) if r in seen else ReplicaLoad(r, ReplicaState.LAUNCHING) for r in view.replicas)
        loads = [load(s) for s in seen.values() if s.report.state != ReplicaState.STOPPED]
        live = sum(1 for r in loads if r.state != ReplicaState.DRAINING)
        loads += [ReplicaLoad(f"pending-{i}", ReplicaState.LAUNCHING) for i in range(max(0, view.target - live))]
        return tuple(loads)

    def paid(self, pool: PoolSpec) -> PaidFloor | None:
        """``pool``'s paid floor this tick: its share of its node group's paid GPUs, moved by the last claims of
        the pools it shares the group with (`fleet.capacity.paid_floor`); None: nothing is paid by the node."""
        claims = {name: c for name, d in self.last.items() if (c := claim_of(d)) is not None}
        return paid_floor(self.spec, pool, claims)

    async def decide(self, pool: PoolSpec, now: float) -> Decision:
        """One pool, one tick: a decision (not yet applied), by `control_plane.scaling.step.decide`. Its paid floor
        moves with the last claims of the pools it shares a node group with (`fleet.capacity.paid_floor`)."""
        paid = self.paid(pool)
        if self.rollouts is not None:
            pool = self.rollouts.bounds(pool)
        view = await self.actuator.current(pool)
        replicas = self.replicas(pool, view, now)
        reported = {s.report.replica for s in self.registry.seen(pool.name, now)}
        if not self.startup.settle(pool.name, now, view.replicas, reported):
            reason = (
                f"starting: waiting up to {self.startup.remaining(now):.1f} s more for the agents' reports "
                "before scaling"
            )
            inputs = {"replicas": [asdict(r) for r in replicas], "reported": sorted(reported)}
            current = sum(1 for r in replicas if r.state not in (ReplicaState.DRAINING, ReplicaState.STOPPED))
            return Hold(pool.name, current, current, reason, now, inputs, self.policy.name)
        window = pool.cold_start_seconds + self.node_lead_s[pool.name]  # until a replacement launched now serves
        departures = observe(self._departures.get(pool.name, Departures()), replicas, now, window)
        step = decide(
            pool,
            self.spec.autoscaling,
            self.policy,
            replicas,
            now,
            gateway=gateway_demand(self.gateways.seen(pool.name, now)),
            per_replica_qps=self.per_replica_qps.get(pool.name),
            demand_history=self._demand.get(pool.name, ()),
            state=self._state.get(pool.name),
            node_lead_s=self.node_lead_s[pool.name],
            paid=paid,
            replacing=departures.replacing,
        )
        if isinstance(step.decision, ScaleDown):  # its victims leave: no death, nothing to replace
            departures = departures.expect((*step.decision.victims, *step.decision.sleep), now)
        self._departures[pool.name] = departures
        self._state[pool.name] = step.state
        self._demand[pool.name] = step.demand_history
        return step.decision

    def record(self, decision: Decision) -> bool:
        """Keep ``decision`` in the log unless it repeats the previous hold's reason; True when kept."""
        previous = self.last.get(decision.pool)
        self.last[decision.pool] = decision
        if (
            isinstance(decision, Hold)
            and isinstance(previous, Hold)
            and _gist(previous.reason) == _gist(decision.reason)
            and previous.target == decision.target
        ):
            return False
        self.decisions.append(decision)
        return True

    async def tick(self, now: float | None = None) -> list[Decision]:
        when = self.clock.time() if now is None else now
        out: list[Decision] = []
        if self.rollouts is not None:
            self.rollouts.tick(when)
            await self.rollouts.save()
        for pool in self.spec.engine_pools:
            decision = await self.decide(pool, when)
            if self.record(decision) and not isinstance(decision, Hold):
                log.info(
                    "%s %s: %d -> %d: %s",
                    decision.kind,
                    decision.pool,
                    decision.current,
                    decision.target,
                    decision.reason,
                )
            if not isinstance(decision, Hold):
                await self.actuator.apply(decision)
            if self.startup.settled(pool.name, when):
                await self.actuator.reconcile(pool, decision.holding, decision.nodes_for)
            out.append(decision)
        return out

    async def run(self) -> None:
        """Tick every intervalS until `stop`; a failing tick is logged and the loop goes on."""
        interval = self.spec.autoscaling.interval_s
        while not self._stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("control loop tick failed")
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=interval)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()
