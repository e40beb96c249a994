"""Rollouts: the control plane's canary rollouts of aliases, and the alias weights gateways serve.

    llmfleet rollout start -> POST /v1/rollouts -> Rollouts.start (after the baseline's error budget allows it)
    gateway reports (per-pool answers) -> SliLedger
    ControlLoop.tick -> Rollouts.tick -> rollout.canary.advance per running rollout -> weights, decision log
    gateways <- GET /v1/aliases (every routing.scrapeIntervalS) <- Rollouts.alias_weights

A rollout owns its alias's weights while it runs: ``{baseline: 100 - w, candidate: w}`` (the alias's other pools
at 0; its fallback stays). Each tick judges the current step on the window since its weight was set: both
pools' answers as the gateways reported them (`rollout.slis.SliLedger`). Promotion leaves the candidate at 100
and the baseline at 0; with ``rollout.baselineAfter: zero`` the baseline's ``replicas.min`` is read as 0 from then
on (`bounds`), so the autoscaler drains it down to no replica the way it scales any idle pool in (stabilisation,
step limits, drains: no request is lost). A rollback or an abort leaves the candidate at 0 and the baseline at
100.

**Restarts.** The states and the retired baselines are kept in a `control_plane.rollout_stores.RolloutStore` (a
Lease object on a cluster, ``<state dir>/rollouts.json`` locally): `save` writes them after every start, step,
promotion, rollback and abort (not after a hold: a hold changes only its reason), and `restore` loads them before
the control plane serves. A restarted control plane so serves the same weights and judges the same step, its
bake time measured from when the step began. The gateways' answers before the restart are not kept: the step's
window counts the answers reported since (so ``minSamples`` may take longer to reach, never less). A write that
fails is logged and tried again on the next tick; until it succeeds a restart would find the previous record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control_plane.rollout_stores import MemoryRolloutStore, RolloutRecord, RolloutStore, RolloutStoreError
from control_plane.scaling.decisions import Decision, RolloutStep
from fleet.protocol.wire import AliasEntry, AliasWeights, RolloutSide, RolloutStatus
from fleet.spec.stack import FleetSpec, PoolSpec
from rollout.canary import (
    METRIC_NAMES,
    CanaryDecision,
    CanaryPlan,
    CanaryState,
    Observation,
    Phase,
    Side,
    abort,
    advance,
    start,
)
from rollout.slis import SliLedger

__all__ = ["KEEP_S", "RolloutCollector", "RolloutError", "Rollouts"]

KEEP_S = 60.0  # gateway answers kept this long outside any running rollout's window

log = logging.getLogger("llmfleet.control_plane.rollouts")


class RolloutError(ValueError):
    """A rollout request that cannot be carried out: ``status`` (404 unknown alias, 400 bad request, 409 conflict)
    and the ``param`` at fault."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def _gist(reason: str) -> str:
    return "".join(ch for ch in reason if not (ch.isdigit() or ch == "."))


class Rollouts:
    """Every alias's rollout (running, or the last finished) and current weights; ``log`` receives decisions,
    ``replicas(pool)`` counts a pool's replicas for them; ``store`` keeps them across restarts (None: memory)."""

    def __init__(
        self,
        spec: FleetSpec,
        log: Callable[[Decision], None] = lambda decision: None,
        replicas: Callable[[str], int] = lambda pool: 0,
        store: RolloutStore | None = None,
    ) -> None:
        self.spec = spec
        self.log = log
        self.replicas = replicas
        self.store = store or MemoryRolloutStore()
        self.unsaved = False  # a change the store does not hold yet
        self.ledger = SliLedger()
        self.states: dict[str, CanaryState] = {}
        self.weights: dict[str, dict[str, int]] = {name: dict(a.pools) for name, a in spec.aliases.items()}
        self.retired: set[str] = set()  # baselines promoted away from, whose replicas.min is read as 0
        self._holds: dict[str, str] = {}  # alias -> gist of the last hold logged

    async def restore(self) -> int:
        """Take the store's rollouts as the current ones (before serving); returns how many. RolloutStoreError
        when the store cannot be read (then the stack's weights are served until a rollout starts). A rollout of
        an alias or a pool the stack no longer has is dropped."""
        record = await self.store.load()
        if record is None:
            return 0
        pools = {p.name for p in self.spec.pools}
        for alias, state in record.states.items():
            entry = self.spec.aliases.get(alias)
            plan = state.plan
            if entry is None or not {plan.baseline, plan.candidate} <= pools:
                log.warning("rollout of %s to %s dropped: the stack has no such alias or pool", alias, plan.candidate)
                continue
            self.states[alias] = state
            self.weights[alias] = {**{p: 0 for p in entry.pools}, **state.weights}
        self.retired = set(record.retired) & pools
        return len(self.states)

    async def save(self) -> bool:
        """Write the rollouts to the store if a change is not saved yet; False when the write failed (logged, and
        tried again on the next call)."""
        if not self.unsaved:
            return True
        try:
            await self.store.save(RolloutRecord(dict(self.states), frozenset(self.retired)))
        except RolloutStoreError as exc:
            log.error(
                "rollouts not saved to %s (%s): a restart now would not find the last change", self.store.where(), exc
            )
            return False
        self.unsaved = False
        return True

    def plan(self, alias: str, candidate: str) -> CanaryPlan:
        """The plan for rolling ``alias`` to ``candidate`` from the stack's settings; RolloutError saying why not."""
        entry = self.spec.aliases.get(alias)
        if entry is None:
            known = ", ".join(self.spec.aliases) or "none"
            raise RolloutError(404, f"no alias {alias!r}; aliases: {known}", "alias")
        pools = [p.name for p in self.spec.pools]
        if candidate not in pools:
            raise RolloutError(400, f"no pool {candidate!r}; pools: {', '.join(pools)}", "candidate")
        if candidate == entry.fallback:
            message = f"{candidate!r} is the fallback of {alias!r}: roll out to another pool"
            raise RolloutError(400, message, "candidate")
        settings = entry.rollout
        others = sorted((p for p in entry.pools if p != candidate), key=lambda p: (-entry.pools[p], p))
        baseline = settings.baseline or (others[0] if others else None)
        if baseline is None or baseline == candidate:
            message = f"{alias!r} has no pool to roll away from besides {candidate!r} (aliases.{alias}.pools)"
            raise RolloutError(400, message, "candidate")
        return CanaryPlan(
            alias,
            baseline,
            candidate,
            tuple(settings.steps),
            settings.bake_s,
            settings.min_samples,
            settings.tolerance,
            settings.baseline_after,
            tuple(METRIC_NAMES[m] for m in settings.metrics),
        )

    def start(self, plan: CanaryPlan, now: float) -> CanaryState:
        """Start ``plan``; RolloutError (409) while a rollout of the same alias runs."""
        running = self.states.get(plan.alias)
        if running is not None and running.active:
            message = (
                f"a rollout of {plan.alias} to {running.plan.candidate} is running ({running.weight}%); "
                "abort it first (llmfleet rollout abort)"
            )
            raise RolloutError(409, message, "alias")
        state, decision = start(plan, now)
        self.retired.discard(plan.candidate)  # a pool rolled back to serves again
        self._apply(state, decision, now)
        return state

    def abort(self, alias: str, now: float) -> CanaryState:
        """Stop ``alias``'s running rollout: the candidate back to 0; RolloutError when none runs."""
        state = self.states.get(alias)
        if state is None:
            raise RolloutError(404, f"no rollout of {alias!r}", "alias")
        try:
            aborted, decision = abort(state, now)
        except ValueError as exc:
            raise RolloutError(409, str(exc), "alias") from None
        self._apply(aborted, decision, now)
        return aborted

    def tick(self, now: float) -> None:
        """Judge every running rollout's current step on its window."""
        running = [s for s in self.states.values() if s.active]
        # Answers older than every running window (and than a minute, for the finished ones' status) are not read.
        self.ledger.trim(min([now - KEEP_S, *(s.step_started_at for s in running)]))
        for state in running:
            since, plan = state.step_started_at, state.plan
            seen = Observation(self.ledger.window(plan.baseline, since), self.ledger.window(plan.candidate, since))
            nxt, decision = advance(state, seen, now)
            self._apply(nxt, decision, now)

    def _apply(self, state: CanaryState, decision: CanaryDecision, now: float) -> None:
        plan = state.plan
        self.unsaved = self.unsaved or decision.action != "hold"
        self.states[plan.alias] = state
        self.weights[plan.alias] = {**{p: 0 for p in self.spec.aliases[plan.alias].pools}, **state.weights}
        if decision.action == "promote" and plan.baseline_after == "zero":
            self.retired.add(plan.baseline)
        if decision.action == "hold":
            if self._holds.get(plan.alias) == _gist(decision.reason):
                return  # the same reason with new figures: the log keeps the first
            self._holds[plan.alias] = _gist(decision.reason)
        else:
            self._holds.pop(plan.alias, None)
        inputs = {
            "deltas": [
                {"metric": d.metric, "baseline": d.baseline, "candidate": d.candidate, "worse": d.worse}
                for d in decision.deltas
            ]
        }
        replicas = self.replicas(plan.candidate)
        self.log(
            RolloutStep(
                plan.candidate,
                replicas,
                replicas,
                decision.reason,
                now,
                inputs,
                policy="canary",
                alias=plan.alias,
                action=decision.action,
                weight_from=decision.weight_from,
                weight_to=decision.weight_to,
                weights=dict(self.weights[plan.alias]),
            )
        )

    def bounds(self, pool: PoolSpec) -> PoolSpec:
        """``pool`` as the autoscaler should size it: a baseline promoted away from with ``baselineAfter: zero``
        has ``replicas.min`` 0."""
        if pool.name not in self.retired or pool.replicas.min == 0:
            return pool
        return pool.model_copy(update={"replicas": pool.replicas.model_copy(update={"min": 0})})

    def alias_weights(self, now: float) -> AliasWeights:
        entries = {
            name: AliasEntry(pools=dict(self.weights[name]), fallback=alias.fallback, sticky=alias.sticky)
            for name, alias in self.spec.aliases.items()
        }
        return AliasWeights(aliases=entries, generated_at=now)

    def status(self, alias: str) -> RolloutStatus:
        """The rollout of ``alias`` with its window so far; RolloutError (404) when it never had one."""
        state = self.states.get(alias)
        if state is None:
            raise RolloutError(404, f"no rollout of {alias!r}", "alias")
        plan, since = state.plan, state.step_started_at
        window = [self._side(plan.baseline, since), self._side(plan.candidate, since)]
        return RolloutStatus(
            alias=alias,
            baseline=plan.baseline,
            candidate=plan.candidate,
            phase=state.phase.value,
            steps=list(plan.steps),
            step=state.step,
            weight=state.weight,
            weights=state.weights,
            bake_s=plan.bake_s,
            min_samples=plan.min_samples,
            tolerance=plan.tolerance,
            metrics=list(plan.metrics),
            started_at=state.started_at,
            step_started_at=since,
            reason=state.reason,
            window=window,
        )

    def _side(self, pool: str, since: float) -> RolloutSide:
        side: Side = self.ledger.window(pool, since)
        return RolloutSide(
            pool=pool,
            requests=side.requests,
            errors=side.errors,
            error_rate=side.error_rate,
            ttft_p99_s=side.ttft_p99_s,
            tpot_p99_s=side.tpot_p99_s,
        )


class RolloutCollector(Collector):
    """Reads `Rollouts` at scrape time: ``llmfleet_alias_weight{alias,pool}`` (the weights gateways serve now) and
    ``llmfleet_rollout_phase{alias,candidate,phase}`` (1 for each alias's rollout's current phase, 0 for the others),
    so a dashboard or an alert can follow a canary."""

    def __init__(self, rollouts: Rollouts) -> None:
        self._rollouts = rollouts

    def collect(self) -> Iterable[Metric]:
        weights = GaugeMetricFamily(
            "llmfleet_alias_weight", "Each pool's weight in its alias, as gateways serve it", labels=["alias", "pool"]
        )
        for alias, pools in sorted(self._rollouts.weights.items()):
            for pool, weight in sorted(pools.items()):
                weights.add_metric([alias, pool], weight)
        yield weights
        phases = GaugeMetricFamily(
            "llmfleet_rollout_phase",
            "1 for the phase each alias's last rollout is in (baking, promoted, rolled-back, aborted)",
            labels=["alias", "candidate", "phase"],
        )
        for alias, state in sorted(self._rollouts.states.items()):
            for phase in Phase:
                phases.add_metric([alias, state.plan.candidate, phase.value], 1.0 if state.phase is phase else 0.0)
        yield phases
