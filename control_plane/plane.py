"""ControlPlane: everything the control plane's API serves from, built once and complete by `ControlPlane.build`.

It holds the registries the reports fill, the restart leases, the error budgets, the canary rollouts and, unless
the control plane only serves discovery, the control loop; the API (`control_plane.api`) reads and writes them.
The clock (`fleet.protocol.clock.Clock`) is injected: its wall time stamps reports, leases and decisions.

Risky changes wait while a pool's error budget is exhausted (``slo.freezeOnExhaustedBudget``): a new restart lease
is refused with 409, as when the pool's leases are all held, so an agent retries later in its window; a rollout
asks `ControlPlane.budget_allows` the same. A refusal goes to the decision log as a `Freeze` (once per pool and
kind of change every `FREEZE_LOG_EVERY_S` while refusals go on). The budget's counts come from a budget source
(`control_plane.budget.sources`; the ``local`` one scrapes the admin /metrics of each gateway that reports, at the
report's source address and ``gateway.adminPort``).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry

from control_plane.actuators import Actuator
from control_plane.budget.budget import ErrorBudgets
from control_plane.budget.sources import BudgetSource, LocalSource
from control_plane.leases.leases import LeaseTable
from control_plane.leases.stores import LeaseStore
from control_plane.loop import ControlLoop
from control_plane.reports import GatewayRegistry, ReplicaRegistry
from control_plane.rollout_stores import RolloutStore, RolloutStoreError
from control_plane.rollouts import Rollouts
from control_plane.scaling.decisions import Decision, Freeze
from control_plane.starts import StartLedger
from fleet.capacity.plan import admission_capacity
from fleet.protocol.clock import Clock
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["DECISION_HISTORY", "FREEZE_LOG_EVERY_S", "ControlPlane"]

FREEZE_LOG_EVERY_S = 300.0  # a refusal repeated within this of the last one logged is not logged again
DECISION_HISTORY = 500  # decisions the log keeps

log = logging.getLogger("llmfleet.control_plane")


@dataclass
class ControlPlane:
    """The control plane's state; ``loop`` is None for a control plane that serves discovery only (it scales
    nothing and keeps no decision log)."""

    spec: FleetSpec
    clock: Clock
    registry: ReplicaRegistry
    gateways: GatewayRegistry
    leases: LeaseTable
    budgets: ErrorBudgets
    rollouts: Rollouts
    loop: ControlLoop | None = None
    http: httpx.AsyncClient | None = None  # the client `build` made for the default budget source, closed by close
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)
    granted: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, gateway) -> last admission share
    freezes_logged: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, change) -> last logged
    starts: StartLedger = field(default_factory=StartLedger)  # measured replica starts per pool
    pools: dict[str, PoolSpec] = field(init=False, repr=False)  # the stack's engine pools by name

    def __post_init__(self) -> None:
        self.pools = {p.name: p for p in self.spec.engine_pools}

    @classmethod
    def build(
        cls,
        spec: FleetSpec,
        clock: Clock,
        actuator: Actuator | None = None,
        *,
        store: LeaseStore | None = None,
        budget_source: BudgetSource | None = None,
        startup_hold_s: float = 0.0,
        rollout_store: RolloutStore | None = None,
    ) -> ControlPlane:
        """A control plane over ``spec``, scaling through ``actuator`` (None: discovery only, no loop); leases kept
        in ``store`` and rollouts in ``rollout_store`` (None: in memory only); error budgets counted by
        ``budget_source`` (None: the ``local`` source); pools held for ``startup_hold_s`` after a start
        (`control_plane.startup`)."""
        cp = spec.control_plane
        pools = {p.name: p for p in spec.engine_pools}
        registry = ReplicaRegistry(cp.stale_after_s, cp.forget_after)
        gateways = GatewayRegistry(cp.stale_after_s, cp.forget_after)
        leases = LeaseTable(lambda pool: pools[pool].restart_window.max_unavailable, cp.lease_ttl_s, store=store)
        http = None
        if budget_source is None:
            http = httpx.AsyncClient()
            budget_source = LocalSource(LocalSource.Params(), http)
        decisions: deque[Decision] = deque(maxlen=DECISION_HISTORY)
        log = decisions.append if actuator is not None else (lambda decision: None)
        rollouts = Rollouts(spec, log, lambda pool: _live(registry, pool, clock.time()), rollout_store)
        loop = None
        if actuator is not None:
            # Ticked with the scaling decisions (retired baselines scale to 0); a replica draining for its planned
            # restart is not replaced.
            loop = ControlLoop(
                spec,
                registry,
                actuator,
                clock,
                gateways=gateways,
                startup_hold_s=startup_hold_s,
                restarting=leases.holders,
                rollouts=rollouts,
                decisions=decisions,
            )
        return cls(spec, clock, registry, gateways, leases, ErrorBudgets(spec, budget_source), rollouts, loop, http)

    async def restore_rollouts(self, store: RolloutStore) -> None:
        """Keep the rollouts in ``store`` from now on and load what it holds, before serving
        (`control_plane.rollouts.Rollouts.restore`); a store that cannot be read is logged, and the stack's
        weights are served until a rollout starts (whose record then replaces the unreadable one)."""
        self.rollouts.store = store
        try:
            log.info("rollouts in %s: %d restored", store.where(), await self.rollouts.restore())
        except RolloutStoreError as exc:
            log.error("rollouts could not be loaded from %s: %s", store.where(), exc)

    def admission_capacity(self, pool: str, now: float) -> int:
        """What all gateways together may admit into ``pool``: its fresh ready replicas x (maxNumSeqs +
        queue.perReplicaThreshold), the figure each gateway computes for itself from the same replica list."""
        spec = self.pools[pool]
        ready = sum(1 for s in self.registry.seen(pool, now) if not s.stale and s.report.state == ReplicaState.READY)
        return admission_capacity(ready, spec.engine.max_num_seqs, self.spec.gateway.queue.per_replica_threshold)

    async def budget_allows(self, pool: str, change: str) -> tuple[bool, str]:
        """Whether a risky ``change`` (``restart``, ``rollout``) may go ahead on ``pool`` now, and why; a refusal
        (an exhausted error budget with ``slo.freezeOnExhaustedBudget``) is recorded in the decision log."""
        now = self.clock.time()
        known = await self.budgets.current(pool, now)
        allowed, reason = self.budgets.decide(pool, change)
        if allowed:
            self.freezes_logged.pop((pool, change), None)
        elif self.loop is not None and now - self.freezes_logged.get((pool, change), -math.inf) >= FREEZE_LOG_EVERY_S:
            # Agents ask again every few seconds while frozen: one entry per freeze and then one every few minutes
            # keeps the scaling decisions in the (bounded) log.
            self.freezes_logged[(pool, change)] = now
            replicas = _live(self.registry, pool, now)
            spent = {b.slo: round(b.spent, 4) for b in known.budgets}
            inputs = {"change": change, "spent": spent, "source": self.budgets.source.name}
            freeze = Freeze(pool, replicas, replicas, reason, now, inputs, policy="error-budget", change=change)
            self.loop.decisions.append(freeze)
        return allowed, reason

    def settled(self, pool: str, now: float) -> bool:
        """Whether the registry can be trusted to list ``pool``'s replicas (see `control_plane.startup`)."""
        return self.loop is None or self.loop.startup.settled(pool, now)

    async def run(self) -> None:
        """Run the control loop until `stop` (at once without one)."""
        if self.loop is not None:
            await self.loop.run()

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()

    async def close(self) -> None:
        """Wait for the error budget's read in progress, then close the client `build` made for it and the
        rollouts' store."""
        await self.budgets.close()
        await self.rollouts.store.close()
        if self.http is not None:
            await self.http.aclose()


def _live(registry: ReplicaRegistry, pool: str, now: float) -> int:
    """The replicas of ``pool`` that have not stopped."""
    return sum(1 for s in registry.seen(pool, now) if s.report.state != ReplicaState.STOPPED)
