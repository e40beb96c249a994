"""Service: the control plane's HTTP API (FastAPI), one process per fleet.

    POST   /v1/reports                        LoadReport from an agent             -> 200 Accepted
    POST   /v1/gateway-reports                GatewayReport from a gateway (its admission queue and request
                                              rate per pool)                 -> 200 GatewayAccepted (its share
                                              of the pool's admission capacity, `control_plane.shares`)
    GET    /v1/pools                          PoolsResponse: pools with bounds, counts, last decision
    GET    /v1/pools/{pool}/budget            PoolBudget: the pool's error budget per SLO
    (`control_plane.budget.budget`) and
                                              whether risky changes may go ahead
    GET    /v1/pools/{pool}/replicas          ReplicaList (discovery for gateways; ``stale`` flag per replica);
                                              503 while a control plane that just started is still hearing from
                                              the pool's agents (`control_plane.startup`): gateways keep their list
    POST   /v1/leases/restart                 LeaseRequest -> 200 LeaseGrant | 409 (maxUnavailable held, or the
                                              pool's error budget is exhausted: restarts are frozen)
                                              | 503 (the lease store cannot be written: nothing granted)
    DELETE /v1/leases/restart/{pool}/{replica}                  -> 200 Released {"released": bool} | 503
    GET    /v1/leases                         LeasesResponse: current holders and the grant/release history
    GET    /v1/decisions[?pool=P&limit=N]     DecisionsResponse: decisions, newest last, each with inputs and reason
    GET    /v1/aliases, /v1/rollouts[/{alias}], POST /v1/rollouts, DELETE /v1/rollouts/{alias}
                                              canary rollouts and the alias weights (`control_plane.rollout_api`)
    GET    /metrics                           Prometheus text
    GET    /healthz                           200 while the process runs
    GET    /openapi.json, /docs               the OpenAPI document and its browsable page

Bodies are the `fleet.protocol.wire` models. Every error, an invalid body or query included (400, never 422), is
OpenAI's
JSON error shape (`fleet.protocol.control_api`); an unknown pool is 404 with ``param: "pool"``. The app holds no global
state: `create_app` builds it from a `ControlPlane`, whose clock is injected. Handlers are ``async`` and run on
the event loop, never in a thread pool; the only I/O they do is the lease calls' write to the lease store
(`control_plane.leases.leases`), awaited, so leases survive a restart of the control plane, and the error budget's read
of
its counts (`control_plane.budget.budget`: at most every 15 s, awaited by lease calls and budget reads, in the
background
on gateway reports).

Writes need a control credential (`fleet.protocol.control_auth`, given as ``create_app(cp, auth)``): reports from an
agent,
gateway reports from a gateway, leases from an agent; 401 without a valid one, 403 for another kind. A report whose
``engine_url`` host is not the caller's own address (`fleet.protocol.control_auth.same_host`) is refused with 403 and
never
reaches the registry, so no pod can point gateways at another host. A lease call is refused with 403 unless the
replica it names last reported from the caller's address: an agent takes and gives back its own replica's lease
only, so no pod can hold a pool's leases to block its restarts, or release another replica's. Reads stay open.
``ControlAuth(None)`` (the default) accepts every caller, as ``--auth none`` does.

Risky changes wait while a pool's error budget is exhausted (``slo.freezeOnExhaustedBudget``): a new restart lease
is refused with 409, as when the pool's leases are all held, so an agent retries later in its window; a rollout
asks `ControlPlane.budget_allows` the same. A refusal goes to the decision log as a `Freeze` (once per pool and
kind of change every `FREEZE_LOG_EVERY_S` while refusals go on). The budget's
counts come from a budget source (`control_plane.budget.sources`; the ``local`` one scrapes the admin /metrics of
each gateway that reports, at the report's source address and ``gateway.adminPort``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from control_plane.budget.budget import ErrorBudgets
from control_plane.budget.sources import BudgetSource, LocalSource
from control_plane.leases.leases import LeaseRefused, LeaseStoreError, LeaseTable
from control_plane.leases.stores import LeaseStore
from control_plane.loop import ControlLoop
from control_plane.reports import GatewayRegistry, ReplicaRegistry
from control_plane.rollout_api import add_rollout_routes
from control_plane.rollouts import RolloutCollector, Rollouts
from control_plane.scaling.decisions import Freeze, decision_to_json
from control_plane.shares import admission_shares, grantable
from fleet.capacity.plan import admission_capacity
from fleet.protocol.control_api import create_control_app, error_response, errors
from fleet.protocol.control_auth import Caller, ControlAuth, Kind, same_host
from fleet.protocol.wire import (
    Accepted,
    DecisionsResponse,
    GatewayAccepted,
    GatewayReport,
    LeaseGrant,
    LeaseRequest,
    LeasesResponse,
    LoadReport,
    PoolBudget,
    PoolsResponse,
    PoolSummary,
    Released,
    ReplicaList,
    ReplicaState,
    SloBudget,
)
from fleet.spec.stack import FleetSpec

__all__ = ["ControlPlane", "create_app"]

# The replicas-per-state gauge's states: what agents report, less ``stopped`` (its agent is gone).
REPORTED_GAUGE_STATES = tuple(s for s in ReplicaState if s not in (ReplicaState.LAUNCHING, ReplicaState.STOPPED))

FREEZE_LOG_EVERY_S = 300.0  # a refusal repeated within this of the last one logged is not logged again


@dataclass
class ControlPlane:
    """Everything the HTTP handlers need; the loop is optional (a discovery-only control plane has none)."""

    spec: FleetSpec
    registry: ReplicaRegistry
    leases: LeaseTable
    clock: Callable[[], float]
    loop: ControlLoop | None = None
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)
    gateways: GatewayRegistry | None = None  # None: a fresh one with the registry's stale limit
    granted: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, gateway) -> last admission share
    budgets: ErrorBudgets | None = None  # None: from the gateways' own counts (the ``local`` budget source)
    freezes_logged: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, change) -> last logged
    rollouts: Rollouts | None = None  # None: a fresh one logging to the loop's decisions

    def __post_init__(self) -> None:
        if self.gateways is None:
            self.gateways = (
                self.loop.gateways if self.loop is not None else GatewayRegistry(self.registry.stale_after_s)
            )
        if self.budgets is None:
            self.budgets = ErrorBudgets(self.spec, LocalSource(LocalSource.Params(), httpx.AsyncClient()))
        if self.rollouts is None:
            log = self.loop.decisions.append if self.loop is not None else (lambda decision: None)
            self.rollouts = Rollouts(self.spec, log, self._replicas)
        if self.loop is not None:
            self.loop.rollouts = self.rollouts  # ticked with the scaling decisions; retired baselines scale to 0

    @classmethod
    def build(
        cls,
        spec: FleetSpec,
        clock: Callable[[], float],
        loop: ControlLoop | None = None,
        store: LeaseStore | None = None,
        budget_source: BudgetSource | None = None,
    ) -> ControlPlane:
        """A control plane over ``spec``; leases kept in ``store`` (None: in memory only); error budgets counted
        by ``budget_source`` (None: the ``local`` source)."""
        cp = spec.control_plane
        pools = {p.name: p for p in spec.pools}
        registry = loop.registry if loop is not None else ReplicaRegistry(cp.stale_after_s)
        leases = LeaseTable(lambda pool: pools[pool].restart_window.max_unavailable, cp.lease_ttl_s, store=store)
        if loop is not None:
            loop.restarting = leases.holders  # a replica draining for its planned restart is not replaced
        budgets = ErrorBudgets(spec, budget_source) if budget_source is not None else None
        return cls(spec, registry, leases, clock, loop, budgets=budgets)

    def admission_capacity(self, pool: str, now: float) -> int:
        """What all gateways together may admit into ``pool``: its fresh ready replicas x (maxNumSeqs +
        queue.perReplicaThreshold), the figure each gateway computes for itself from the same replica list."""
        spec = next(p for p in self.spec.pools if p.name == pool)
        ready = sum(1 for s in self.registry.seen(pool, now) if not s.stale and s.report.state == ReplicaState.READY)
        return admission_capacity(ready, spec.engine.max_num_seqs, self.spec.gateway.queue.per_replica_threshold)

    async def budget_allows(self, pool: str, change: str) -> tuple[bool, str]:
        """Whether a risky ``change`` (``restart``, ``rollout``) may go ahead on ``pool`` now, and why; a refusal
        (an exhausted error budget with ``slo.freezeOnExhaustedBudget``) is recorded in the decision log."""
        assert self.budgets is not None  # set by __post_init__
        now = self.clock()
        known = await self.budgets.current(pool, now)
        allowed, reason = self.budgets.decide(pool, change)
        if allowed:
            self.freezes_logged.pop((pool, change), None)
        elif self.loop is not None and now - self.freezes_logged.get((pool, change), -math.inf) >= FREEZE_LOG_EVERY_S:
            # Agents ask again every few seconds while frozen: one entry per freeze and then one every few minutes
            # keeps the scaling decisions in the (bounded) log.
            self.freezes_logged[(pool, change)] = now
            replicas = sum(1 for s in self.registry.seen(pool, now) if s.report.state != ReplicaState.STOPPED)
            spent = {b.slo: round(b.spent, 4) for b in known.budgets}
            inputs = {"change": change, "spent": spent, "source": self.budgets.source.name}
            freeze = Freeze(pool, replicas, replicas, reason, now, inputs, policy="error-budget", change=change)
            self.loop.decisions.append(freeze)
        return allowed, reason

    def _replicas(self, pool: str) -> int:
        return sum(1 for s in self.registry.seen(pool, self.clock()) if s.report.state != ReplicaState.STOPPED)

    def settled(self, pool: str, now: float) -> bool:
        """Whether the registry can be trusted to list ``pool``'s replicas (see `control_plane.startup`)."""
        return self.loop is None or self.loop.startup.settled(pool, now)


def create_app(cp: ControlPlane, auth: ControlAuth | None = None) -> FastAPI:
    """The FastAPI application serving `cp`; ``auth`` guards the writes (None: open, as ``--auth none``)."""
    auth = auth or ControlAuth(None)
    agent_only = Depends(auth.require(Kind.AGENT))
    gateway_only = Depends(auth.require(Kind.GATEWAY))
    pools = {p.name: p for p in cp.spec.pools}
    reports = Counter("llmfleet_control_plane_reports_total", "Load reports received", ["pool"], registry=cp.metrics)
    replicas_g = Gauge(
        "llmfleet_pool_replicas", "Replicas known per pool and state", ["pool", "state"], registry=cp.metrics
    )
    stale_g = Gauge("llmfleet_pool_stale_replicas", "Replicas whose reports stopped", ["pool"], registry=cp.metrics)
    target_g = Gauge("llmfleet_autoscaler_target_replicas", "Last decided target", ["pool"], registry=cp.metrics)
    leases_g = Gauge("llmfleet_restart_leases", "Restart leases held", ["pool"], registry=cp.metrics)
    gateway_reports = Counter(
        "llmfleet_control_plane_gateway_reports_total", "Gateway reports received", ["pool"], registry=cp.metrics
    )
    gateway_waiting = Gauge(
        "llmfleet_gateway_reported_waiting",
        "Admission queue a gateway last reported",
        ["pool", "gateway"],
        registry=cp.metrics,
    )
    refused = Counter("llmfleet_restart_leases_refused_total", "Lease requests refused", ["pool"], registry=cp.metrics)
    spent_g = Gauge(
        "llmfleet_error_budget_spent",
        "Fraction of the error budget spent over slo.budgetWindow, as last read",
        ["pool", "slo"],
        registry=cp.metrics,
    )
    gateways, budgets, rollouts = cp.gateways, cp.budgets, cp.rollouts
    assert gateways is not None and budgets is not None and rollouts is not None  # set by ControlPlane.__post_init__
    cp.metrics.register(RolloutCollector(rollouts))

    def unknown_pool(name: str) -> JSONResponse:
        return error_response(404, f"no pool {name!r}; pools: {', '.join(pools)}", "pool")

    def not_its_replica(caller: Caller | None, pool: str, replica: str) -> JSONResponse | None:
        """403 unless ``caller`` (None: auth off) is the agent of ``replica``: the one that reported it from its
        own address."""
        if caller is None:
            return None
        last = next((s.report for s in cp.registry.seen(pool, cp.clock()) if s.report.replica == replica), None)
        if last is None or not same_host(last.engine_url, caller.ip):
            message = (
                f"replica {replica!r} of {pool} has not reported from {caller.ip}: an agent holds its own lease only"
            )
            return error_response(403, message, "replica", type_="permission_error")
        return None

    def store_down(exc: LeaseStoreError) -> JSONResponse:
        message = f"restart leases cannot be kept right now ({exc}); retry later"
        return error_response(503, message, None, type_="service_unavailable")

    app = create_control_app(
        "llmfleet control plane",
        "Load reports from agents and gateways, discovery, restart leases and the scaling decision log.",
    )
    auth.install(app)
    add_rollout_routes(app, rollouts, auth, cp.clock, cp.budget_allows)

    @app.post("/v1/reports", response_model=Accepted, responses=errors(400, 401, 403, 404))
    async def post_report(report: LoadReport, caller: Caller | None = agent_only) -> Accepted | JSONResponse:
        """An agent's load report (about once a second); 403 when its ``engine_url`` is not the caller's host."""
        if report.pool not in pools:
            return unknown_pool(report.pool)
        if caller is not None and not same_host(report.engine_url, caller.ip):
            message = f"engine_url {report.engine_url} is not on the reporting host {caller.ip}"
            return error_response(403, message, "engine_url", type_="permission_error")
        cp.registry.record(report, cp.clock())
        reports.labels(report.pool).inc()
        return Accepted(accepted=True, stale_after_s=cp.registry.stale_after_s)

    @app.post(
        "/v1/gateway-reports",
        response_model=GatewayAccepted,
        responses=errors(400, 401, 403, 404),
        dependencies=[gateway_only],
    )
    async def post_gateway_report(report: GatewayReport, request: Request) -> GatewayAccepted | JSONResponse:
        """A gateway's admission queue and request rates for one pool; the answer carries its admission share."""
        if report.pool not in pools:
            return unknown_pool(report.pool)
        now = cp.clock()
        gateways.record(report, now)
        rollouts.ledger.record(report.pool, report.outcomes, now)
        if request.client is not None:
            host = request.client.host
            admin = f"[{host}]" if ":" in host else host
            budgets.saw_gateway(report.gateway, f"http://{admin}:{cp.spec.gateway.admin_port}/metrics", now)
            budgets.refresh_later(now)
        gateway_reports.labels(report.pool).inc()
        gateway_waiting.labels(report.pool, report.gateway).set(report.waiting)
        live = {s.report.gateway: s.report for s in gateways.seen(report.pool, now) if not s.stale}
        capacity = cp.admission_capacity(report.pool, now)
        share = None  # no capacity to divide yet: the gateway keeps its floor
        if capacity > 0:
            target = admission_shares({g: r.demand for g, r in live.items()}, capacity)[report.gateway]
            held = {g: max(cp.granted.get((report.pool, g), 0.0), r.in_flight / capacity) for g, r in live.items()}
            share = grantable(report.gateway, target, held)
            cp.granted[(report.pool, report.gateway)] = share
        return GatewayAccepted(
            accepted=True, stale_after_s=gateways.stale_after_s, admission_share=share, gateways=len(live)
        )

    @app.get("/v1/pools", response_model=PoolsResponse, responses=errors())
    async def get_pools() -> PoolsResponse:
        """Every pool: bounds, replica counts and the last decision."""
        now = cp.clock()
        out = []
        for pool in cp.spec.pools:
            seen = cp.registry.seen(pool.name, now)
            last = cp.loop.last.get(pool.name) if cp.loop else None
            out.append(
                PoolSummary(
                    pool=pool.name,
                    model=pool.served_name,
                    min=pool.replicas.min,
                    max=pool.replicas.max,
                    replicas=len([s for s in seen if s.report.state != ReplicaState.STOPPED]),
                    ready=len([s for s in seen if s.report.state == ReplicaState.READY and not s.stale]),
                    stale=len([s for s in seen if s.stale]),
                    last_decision=decision_to_json(last) if last else None,
                )
            )
        return PoolsResponse(pools=out, generated_at=now)

    @app.get("/v1/pools/{pool}/budget", response_model=PoolBudget, responses=errors(404))
    async def get_budget(pool: str) -> PoolBudget | JSONResponse:
        """The pool's error budget per SLO over ``slo.budgetWindow`` (planned restart windows excluded), read
        again from the budget source when older than its refresh period, and whether risky changes may go ahead."""
        if pool not in pools:
            return unknown_pool(pool)
        known = await budgets.current(pool, cp.clock())
        allowed, reason = budgets.decide(pool, "a risky change")
        slo = pools[pool].slo
        return PoolBudget(
            pool=pool,
            source=budgets.source.name,
            computed_at=known.at,
            error=known.error,
            freeze=slo.freeze_on_exhausted_budget,
            allows_changes=allowed,
            reason=reason,
            slos=[SloBudget.model_validate({**asdict(b), "window": slo.budget_window}) for b in known.budgets],
        )

    @app.get("/v1/pools/{pool}/replicas", response_model=ReplicaList, responses=errors(404, 503))
    async def get_replicas(pool: str) -> ReplicaList | JSONResponse:
        """Discovery for gateways: the pool's replicas (stopped ones excluded), each with its ``stale`` flag; 503
        until a control plane that just started has heard from the pool's agents."""
        if pool not in pools:
            return unknown_pool(pool)
        now = cp.clock()
        if not cp.settled(pool, now):
            message = f"the control plane just started and is waiting for pool {pool!r}'s agents to report; retry"
            return error_response(503, message, None, type_="service_unavailable")
        return cp.registry.replica_list(pool, pools[pool].served_name, now)

    @app.post(
        "/v1/leases/restart",
        response_model=LeaseGrant,
        responses=errors(400, 401, 403, 404, 409, 503),
    )
    async def post_lease(req: LeaseRequest, caller: Caller | None = agent_only) -> LeaseGrant | JSONResponse:
        """A planned-restart lease; 409 while the pool's ``maxUnavailable`` leases are held by others, 503 when the
        lease store cannot be written (no lease is granted that a restart would forget)."""
        if req.pool not in pools:
            return unknown_pool(req.pool)
        if (refusal := not_its_replica(caller, req.pool, req.replica)) is not None:
            return refusal
        if req.replica not in cp.leases.holders(req.pool, cp.clock()):  # a holder renewing is mid-restart already
            allowed, reason = await cp.budget_allows(req.pool, "restart")
            if not allowed:
                refused.labels(req.pool).inc()
                return error_response(409, f"{reason}; retry later", "pool")
        try:
            result = await cp.leases.acquire_and_save(req.pool, req.replica, cp.clock(), req.ttl_s)
        except LeaseStoreError as exc:
            return store_down(exc)
        if isinstance(result, LeaseRefused):
            refused.labels(req.pool).inc()
            return error_response(
                409,
                f"pool {req.pool!r} already has {len(result.holders)} of {result.max_unavailable} restart "
                f"lease(s) held by {', '.join(result.holders)}; retry later",
                "replica",
            )
        return result

    @app.delete(
        "/v1/leases/restart/{pool}/{replica}",
        response_model=Released,
        responses=errors(401, 403, 404, 503),
    )
    async def delete_lease(pool: str, replica: str, caller: Caller | None = agent_only) -> Released | JSONResponse:
        """Give a restart lease back (``released`` is False when it was not held)."""
        if pool not in pools:
            return unknown_pool(pool)
        if (refusal := not_its_replica(caller, pool, replica)) is not None:
            return refusal
        try:
            return Released(released=await cp.leases.release_and_save(pool, replica, cp.clock()))
        except LeaseStoreError as exc:
            return store_down(exc)

    @app.get("/v1/leases", response_model=LeasesResponse, responses=errors())
    async def get_leases() -> LeasesResponse:
        """Lease holders per pool and the recent lease events."""
        return LeasesResponse.model_validate(cp.leases.snapshot(cp.clock()))

    @app.get("/v1/decisions", response_model=DecisionsResponse, responses=errors(400))
    async def get_decisions(pool: str | None = None, limit: int = 100) -> DecisionsResponse:
        """The last ``limit`` decisions (of ``pool``, or of every pool), oldest first."""
        if cp.loop is None or limit <= 0:
            return DecisionsResponse(decisions=[])
        items = [d for d in cp.loop.decisions if pool is None or d.pool == pool][-limit:]
        return DecisionsResponse(decisions=[decision_to_json(d) for d in items])

    @app.get("/metrics", response_class=PlainTextResponse, responses=errors(plain_text=True))
    async def metrics() -> PlainTextResponse:
        """Prometheus text: reports received, replicas per state, stale replicas, targets, leases."""
        now = cp.clock()
        for pool in cp.spec.pools:
            seen = cp.registry.seen(pool.name, now)
            for state in REPORTED_GAUGE_STATES:
                replicas_g.labels(pool.name, state).set(sum(1 for s in seen if s.report.state == state))
            stale_g.labels(pool.name).set(sum(1 for s in seen if s.stale))
            leases_g.labels(pool.name).set(len(cp.leases.holders(pool.name, now)))
            if cp.loop is not None and pool.name in cp.loop.last:
                target_g.labels(pool.name).set(cp.loop.last[pool.name].target)
            for budget in budgets.latest[pool.name].budgets:
                spent_g.labels(pool.name, budget.slo).set(budget.spent)
        return PlainTextResponse(generate_latest(cp.metrics))

    @app.get("/healthz", responses=errors())
    async def healthz() -> dict[str, str]:
        """200 while the process runs."""
        return {"status": "ok"}

    return app
