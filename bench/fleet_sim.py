"""Fleet simulation: routing + autoscaling + the real engine scheduler, discrete-event, in virtual time.

No processes and no HTTP: each replica is an `engine_sim.scheduler.Scheduler` (the same continuous-batching
object the simulated engine serves from, timed by the calibrated `fleet.perf.StepTimeModel`), the gateway is
`gateway.routing.base.Router` built from the stack's filters/scorers/picker over `EndpointView` snapshots, and the
control loop is `simulate.control.Controller`: the live loop's own decision step (`autoscaler.step.decide`) over
the replicas' last scrapes and the gateway's last report. A launched replica becomes ready ``coldStartSeconds``
later; a replica chosen to go stops taking traffic at once and stops when its last request finishes (drain).

Events: arrivals (Poisson, a seeded day-shaped trace: quiet, ramp, plateau, drop, burst, quiet), engine step
ends, metrics scrapes (every ``SCRAPE_S``: what the gateway's endpoint view and the agents' reports see; the
gateway's own in-flight count is always live; the gateway's report of its admission queue and request rate,
`fleet.wire.GatewayReport` with the rates of `gateway.reporting.PoolTraffic`, goes out at the same time),
gateway queue timeouts, and control-loop ticks
(``autoscaling.intervalS``). The gateway admits as `gateway.admission.Admission` does: up to ready replicas x
(``maxNumSeqs`` + ``queue.perReplicaThreshold``) in flight, the rest wait FIFO up to ``queue.timeoutS`` (then
503), at most ``queue.maxWaiting`` (then 429). Requests take a prompt of ~200 tokens (a shared 96-token system
prompt out of a few, plus a spread) and ~80 output tokens.

Compared in one run, same trace and seed:

* ``baseline``: ``random`` picker + ``threshold`` scaling, engine reports only;
* ``default``: the stack's routing (``p2c`` over queue-depth, KV usage, prefix affinity) + ``target-tracking``,
  once on the agents' engine reports only (what the control plane saw before gateways reported) and once with
  the gateway's reports too (its admission queue in ``queue_depth``, its request rate against the plan's
  per-replica QPS);
* ``default+predictive``: the same with ``autoscaling.predictive`` on (as the prod stack ships).

Printed per configuration: engine busy time / replica time (GPU utilisation as ``nvidia-smi`` would show it,
over every billed replica-second incl. cold starts and drains), served requests/s vs the plan's at-SLO
capacity (``fleet.capacity.per_replica_qps`` x replicas), replica-hours, virtual TTFT p50/p99 as the client sees
it (gateway queue + engine), the share of requests over the TTFT SLO or rejected, rejections, preemptions, and
the ratios against the baseline. A bench: it prints, never asserts.

    .venv/bin/python bench/fleet_sim.py                 # prod pool, trace scaled to fit a couple of minutes
    .venv/bin/python bench/fleet_sim.py --scale 1.0 --min-replicas 3   # the full-size trace (slow)
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bench/engine_sim.py would shadow the engine_sim package: put the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.context import ReplicaLoad  # noqa: E402
from autoscaler.decisions import ScaleDown, ScaleUp  # noqa: E402
from autoscaler.loop import planned_qps  # noqa: E402
from autoscaler.policies import make_policy  # noqa: E402
from engine_sim.config import EngineConfig, build_scheduler  # noqa: E402
from engine_sim.scheduler import Scheduler, SimRequest, StepPlan  # noqa: E402
from fleet.capacity import admission_capacity, model_facts, plan_pool, pool_gpu  # noqa: E402
from fleet.commands.registries import all_registries  # noqa: E402
from fleet.loader import load_spec  # noqa: E402
from fleet.spec import AutoscalingSpec, FleetSpec, PluginRef, PoolSpec  # noqa: E402
from fleet.wire import GatewayReport  # noqa: E402
from gateway.reporting import PoolTraffic  # noqa: E402
from gateway.routing.base import EndpointView, RequestInfo, Router  # noqa: E402
from simulate.control import Controller  # noqa: E402

SCRAPE_S = 1.0  # agents and gateways scrape engine metrics about once a second
TTFT_WINDOW_S = 30.0  # the agent's TTFT P99 window
SYSTEM_PROMPTS = 6
SYSTEM_TOKENS = 96


# -- the trace ----------------------------------------------------------------------------------------------
def day_shape(t: float) -> float:
    """Relative request rate (peak 1.0) over a compressed day: quiet, ramp, plateau, drop, burst, quiet."""
    if t < 200:
        return 0.25
    if t < 600:
        return 0.25 + 0.75 * (t - 200) / 400
    if t < 900:
        return 1.0
    if t < 1100:
        return 0.3
    if t < 1200:
        return 0.8
    return 0.25


TRACE_END_S = 1500.0


@dataclass(frozen=True)
class Arrival:
    t: float
    rid: str
    system: int
    prompt_tokens: int
    output_tokens: int


def make_trace(peak_qps: float, seed: int, end_s: float = TRACE_END_S) -> list[Arrival]:
    """Poisson arrivals by thinning at ``peak_qps * day_shape(t)``; 200 +- 50 prompt, 80 +- 25 output tokens."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    for i in itertools.count():
        t += rng.expovariate(peak_qps)
        if t >= end_s:
            break
        if rng.random() > day_shape(t):
            continue
        prompt = max(SYSTEM_TOKENS + 8, round(rng.gauss(200, 50)))
        output = max(4, round(rng.gauss(80, 25)))
        out.append(Arrival(t, f"req-{i}", rng.randrange(SYSTEM_PROMPTS), prompt, output))
    return out


# -- replicas -------------------------------------------------------------------------------------------------
@dataclass
class Replica:
    name: str
    scheduler: Scheduler
    launched_at: float
    state: str = "launching"  # launching -> ready -> draining -> stopped
    stopped_at: float | None = None
    plan: StepPlan | None = None
    in_flight: int = 0
    # the last scrape: (running, waiting, kv_usage, ttft_p99_s, tokens_per_s), taken at ``scraped_at``
    scraped: tuple[float, float, float, float | None, float] = (0.0, 0.0, 0.0, None, 0.0)
    scraped_at: float | None = None
    gen_tokens_at_scrape: int = 0
    ttfts: deque[tuple[float, float]] = field(default_factory=deque)

    def busy_s(self) -> float:
        return self.scheduler.stats.busy_seconds


@dataclass(frozen=True)
class Config:
    name: str
    picker: str
    policy: str
    predictive: bool
    gateway_reports: bool = True  # the gateway's queue and request rate reach the scaler


@dataclass
class Result:
    config: Config
    requests: int = 0
    completed: int = 0
    unrouted: int = 0
    rejected: int = 0  # gateway queue full (429) or timed out (503)
    ttfts: list[float] = field(default_factory=list)
    replica_s: float = 0.0
    busy_s: float = 0.0
    preemptions: int = 0
    peak_replicas: int = 0
    actions: int = 0
    wall_s: float = 0.0
    generated_tokens: int = 0
    end_s: float = 0.0  # virtual time the last request finished


class FleetSim:
    """One pool, one configuration, one trace: run() returns the Result."""

    def __init__(self, spec: FleetSpec, pool: PoolSpec, config: Config, trace: list[Arrival], seed: int) -> None:
        self.spec, self.pool, self.config, self.trace = spec, pool, config, trace
        routing = spec.gateway.routing
        self.router = Router.from_refs(
            routing.filters, routing.scorers, PluginRef(name=config.picker, params={"seed": seed})
        )
        self.autoscaling: AutoscalingSpec = spec.autoscaling.model_copy(
            update={"policy": PluginRef(name=config.policy), "predictive": config.predictive}
        )
        self.controller = Controller(
            pool=pool,
            autoscaling=self.autoscaling,
            policy=make_policy(config.policy),
            per_replica_qps=planned_qps(spec, pool) if config.gateway_reports else None,
            stale_after_s=spec.control_plane.stale_after_s,
            gateway_reports=config.gateway_reports,
        )
        eng = pool.engine
        self.engine_config = EngineConfig(
            model=pool.model,
            facts=model_facts(pool),
            served_model_name=pool.served_model_name or pool.model,
            gpu_profile=pool_gpu(spec, pool).name,
            tensor_parallel_size=eng.tensor_parallel_size,
            gpu_memory_utilization=eng.gpu_memory_utilization,
            max_model_len=eng.max_model_len,
            max_num_seqs=eng.max_num_seqs,
            max_num_batched_tokens=eng.max_num_batched_tokens,
            enable_prefix_caching=eng.enable_prefix_caching,
        )
        self.model = self.engine_config.served_model_name
        self.replicas: list[Replica] = []
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.names = itertools.count()
        self.result = Result(config)
        token_rng = random.Random(seed + 1)
        self.tokens = [token_rng.randrange(1000, 30000) for _ in range(1 << 16)]
        self.systems = [self.tokens[i * SYSTEM_TOKENS : (i + 1) * SYSTEM_TOKENS] for i in range(SYSTEM_PROMPTS)]
        self.system_text = [f"system prompt {i}: " + "x" * 300 for i in range(SYSTEM_PROMPTS)]
        self.token_rng = token_rng
        # gateway admission (as gateway.admission.Admission): in flight <= routable x (maxNumSeqs + threshold),
        # the rest wait FIFO up to timeoutS (then 503), at most maxWaiting of them (then 429)
        self.queue_cfg = spec.gateway.queue
        self.gw_queue: deque[Arrival] = deque()
        self.gw_queued: set[str] = set()
        self.gw_in_flight = 0
        self.arrived_at: dict[str, float] = {}
        # the gateway's report to the control plane (as gateway.reporting.GatewayReporter builds it)
        self.traffic = PoolTraffic(samples=deque([(0.0, 0, 0)]))
        self.gw_report: GatewayReport | None = None

    # -- event plumbing ------------------------------------------------------------------------------------
    def push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def launch(self, now: float) -> None:
        name = f"{self.pool.name}-{next(self.names)}"
        replica = Replica(name, build_scheduler(self.engine_config, started_at=now), launched_at=now)
        self.replicas.append(replica)
        self.push(now + self.pool.cold_start_seconds, "ready", replica)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state != "stopped"]

    def run(self) -> Result:
        start = time.perf_counter()
        end = self.trace[-1].t if self.trace else 0.0
        for _ in range(self.pool.replicas.min):
            replica = Replica(
                f"{self.pool.name}-{next(self.names)}", build_scheduler(self.engine_config), launched_at=0.0
            )
            replica.state = "ready"
            self.replicas.append(replica)
        for a in self.trace:
            self.push(a.t, "arrival", a)
        self.push(0.0, "scrape")
        self.push(self.autoscaling.interval_s, "tick")
        handlers: dict[str, Callable[[float, Any], None]] = {
            "arrival": self.on_arrival,
            "step": self.on_step,
            "ready": self.on_ready,
            "scrape": self.on_scrape,
            "tick": self.on_tick,
            "queue-timeout": self.on_queue_timeout,
        }
        now = 0.0
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            idle = not self.gw_queued and not any(r.in_flight for r in self.replicas)
            if kind in ("scrape", "tick") and now > end and idle:
                continue  # the trace is over and every request has finished: let the clock stop
            handlers[kind](now, payload)
        for r in self.replicas:
            stop = r.stopped_at if r.stopped_at is not None else now
            self.result.replica_s += stop - r.launched_at
            self.result.busy_s += r.busy_s()
            self.result.preemptions += r.scheduler.stats.preemptions
            self.result.generated_tokens += r.scheduler.stats.generation_tokens
        self.result.wall_s = time.perf_counter() - start
        self.result.end_s = now
        return self.result

    # -- handlers --------------------------------------------------------------------------------------------
    def endpoint_view(self, r: Replica, now: float) -> EndpointView:
        running, waiting, kv, _, _ = r.scraped
        return EndpointView(
            id=r.name,
            url=f"sim://{r.name}",
            pool=self.pool.name,
            model=self.model,
            ready=r.state == "ready",
            ejected=False,
            metrics_age_s=None if r.scraped_at is None else now - r.scraped_at,
            running=running,
            waiting=waiting,
            kv_usage=kv,
            in_flight=r.in_flight,
            max_num_seqs=self.pool.engine.max_num_seqs,
        )

    def admission_capacity(self) -> int:
        routable = sum(1 for r in self.replicas if r.state == "ready")
        return admission_capacity(routable, self.pool.engine.max_num_seqs, self.queue_cfg.per_replica_threshold)

    def on_arrival(self, now: float, a: Arrival) -> None:
        self.result.requests += 1
        self.arrived_at[a.rid] = a.t
        self.traffic.arrived += 1
        if not self.gw_queue and self.gw_in_flight < self.admission_capacity():
            self.dispatch(now, a)
        elif len(self.gw_queue) >= self.queue_cfg.max_waiting:
            self.result.rejected += 1
        else:
            self.gw_queue.append(a)
            self.gw_queued.add(a.rid)
            self.push(now + self.queue_cfg.timeout_s, "queue-timeout", a)

    def on_queue_timeout(self, now: float, a: Arrival) -> None:
        if a.rid in self.gw_queued:
            self.gw_queued.discard(a.rid)
            self.result.rejected += 1

    def pump(self, now: float) -> None:
        """Admit queued requests while the pool has room (a slot freed, a replica became ready)."""
        capacity = self.admission_capacity()
        while self.gw_queue and self.gw_in_flight < capacity:
            a = self.gw_queue.popleft()
            if a.rid in self.gw_queued:
                self.gw_queued.discard(a.rid)
                self.dispatch(now, a)

    def dispatch(self, now: float, a: Arrival) -> None:
        views = [self.endpoint_view(r, now) for r in self.replicas if r.state == "ready"]
        info = RequestInfo(a.rid, self.model, "acme", 8, self.system_text[a.system] + a.rid, None, now)
        decision = self.router.route(views, info)
        if decision is None:
            self.result.unrouted += 1
            return
        self.traffic.admitted += 1
        replica = next(r for r in self.replicas if r.name == decision.endpoint.id)
        offset = self.token_rng.randrange(len(self.tokens) - a.prompt_tokens)
        body = self.tokens[offset : offset + a.prompt_tokens - SYSTEM_TOKENS]
        request = SimRequest(a.rid, self.systems[a.system] + body, max_tokens=a.output_tokens)
        replica.scheduler.add(request, now)
        replica.in_flight += 1
        self.gw_in_flight += 1
        self.kick(replica, now)

    def kick(self, r: Replica, now: float) -> None:
        """Start the replica's next step when it is idle and has work."""
        if r.plan is None and r.scheduler.has_work():
            r.plan = r.scheduler.schedule(now)
            if r.plan is not None:
                self.push(r.plan.end, "step", r)

    def on_step(self, now: float, r: Replica) -> None:
        assert r.plan is not None
        result = r.scheduler.complete(r.plan)
        r.plan = None
        for ev in result.events:
            if ev.first:  # the client's TTFT includes the gateway queue; the agent sees the engine's
                self.result.ttfts.append(now - self.arrived_at.pop(ev.request.request_id))
                r.ttfts.append((now, ev.latency))
            if ev.finished is not None:
                r.in_flight -= 1
                self.gw_in_flight -= 1
                self.result.completed += 1
        self.kick(r, now)
        if self.gw_queue:
            self.pump(now)
        if r.state == "draining" and r.in_flight == 0:
            self.stop(r, now)

    def stop(self, r: Replica, now: float) -> None:
        r.state, r.stopped_at = "stopped", now

    def on_ready(self, now: float, r: Replica) -> None:
        if r.state == "launching":
            r.state = "ready"
            self.pump(now)

    def on_scrape(self, now: float, _: Any) -> None:
        for r in self.replicas:
            if r.state not in ("ready", "draining"):
                continue
            while r.ttfts and now - r.ttfts[0][0] > TTFT_WINDOW_S:
                r.ttfts.popleft()
            p99 = _quantile(sorted(v for _, v in r.ttfts), 0.99) if r.ttfts else None
            gen = r.scheduler.stats.generation_tokens
            tps = (gen - r.gen_tokens_at_scrape) / SCRAPE_S
            r.gen_tokens_at_scrape = gen
            sched = r.scheduler
            r.scraped = (float(sched.num_running), float(sched.num_waiting), sched.kv_usage, p99, tps)
            r.scraped_at = now
        arrived, admitted, span = self.traffic.rates(now, 10.0)
        self.gw_report = GatewayReport(
            gateway="gw-0",
            pool=self.pool.name,
            waiting=len(self.gw_queued),
            in_flight=self.gw_in_flight,
            arrived_per_s=arrived,
            admitted_per_s=admitted,
            window_s=span,
            ts=now,
        )
        self.push(now + SCRAPE_S, "scrape")

    def loads(self) -> tuple[ReplicaLoad, ...]:
        out: list[ReplicaLoad] = []
        for r in self.live():
            if r.state == "launching" or r.scraped_at is None:
                out.append(ReplicaLoad(r.name, "launching" if r.state == "launching" else r.state))
                continue
            running, waiting, kv, p99, tps = r.scraped
            out.append(ReplicaLoad(r.name, r.state, False, waiting, running, kv, p99, tps, 0.0))
        return tuple(out)

    def on_tick(self, now: float, _: Any) -> None:
        decision = self.controller.step(now, self.loads(), self.gw_report)
        if isinstance(decision, ScaleUp):
            self.result.actions += 1
            for _ in range(decision.target - decision.current):
                self.launch(now)
        elif isinstance(decision, ScaleDown):
            self.result.actions += 1
            for name in decision.victims:
                r = next(x for x in self.replicas if x.name == name)
                if r.state == "launching" or r.in_flight == 0:
                    self.stop(r, now)
                else:
                    r.state = "draining"
        self.result.peak_replicas = max(self.result.peak_replicas, len(self.live()))
        self.push(now + self.autoscaling.interval_s, "tick")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


# -- driver ---------------------------------------------------------------------------------------------------
CONFIGS = (
    Config("baseline: random + threshold", "random", "threshold", False, gateway_reports=False),
    Config("default, engine reports only", "p2c", "target-tracking", False, gateway_reports=False),
    Config("default: p2c + target-tracking", "p2c", "target-tracking", False),
    Config("default+predictive, engine only", "p2c", "target-tracking", True, gateway_reports=False),
    Config("default + predictive", "p2c", "target-tracking", True),
)


def _run_one(args: tuple[str, float, int, int, Config]) -> Result:
    stack, peak_qps, min_replicas, seed, config = args
    spec, pool = _spec_and_pool(stack, min_replicas)
    trace = make_trace(peak_qps, seed)
    return FleetSim(spec, pool, config, trace, seed).run()


def _spec_and_pool(stack: str, min_replicas: int) -> tuple[FleetSpec, PoolSpec]:
    spec = load_spec(stack, registries=all_registries()).spec
    pool = spec.pools[0]
    replicas = pool.replicas.model_copy(update={"min": min_replicas})
    pool = pool.model_copy(update={"replicas": replicas})
    return spec, pool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--scale", type=float, default=0.5, help="trace peak as a fraction of the pool's peakQps")
    parser.add_argument("--min-replicas", type=int, default=1, help="pool minimum (prod: 3; scaled with the trace)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2, help="configurations simulated in parallel")
    args = parser.parse_args(argv)

    spec, pool = _spec_and_pool(args.stack, args.min_replicas)
    plan = plan_pool(spec, pool)
    peak_qps = pool.workload.peak_qps * args.scale
    n = len(make_trace(peak_qps, args.seed))
    slo = pool.slo.ttft_p99_ms / 1000.0
    a = spec.autoscaling
    print(
        f"fleet_sim: stack {args.stack}, pool {pool.name} ({pool.model} on {plan.gpu}), "
        f"{plan.per_replica_qps:.1f} req/s per replica at the decode SLO, replicas {pool.replicas.min}.."
        f"{pool.replicas.max}, cold start {pool.cold_start_seconds:g}s, TTFT SLO {slo * 1000:.0f}ms"
    )
    print(
        f"trace: {TRACE_END_S:g}s virtual, peak {peak_qps:g} req/s ({args.scale:g} x peakQps), {n} requests, "
        f"~200+80 tokens, seed {args.seed}; loop every {a.interval_s:g}s, scale-down window "
        f"{a.scale_down_stabilization_s:g}s, step +{a.max_scale_up_step}/-{a.max_scale_down_step}"
    )
    jobs = [(args.stack, peak_qps, args.min_replicas, args.seed, c) for c in CONFIGS]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        results = list(ex.map(_run_one, jobs))
    header = (
        f"{'configuration':<32} {'busy/rep':>8} {'req/cap':>7} {'rep-h':>6} {'peak':>4} {'TTFT p50':>8} "
        f"{'p99':>7} {'>SLO':>6} {'reject':>6} {'preempt':>7} {'actions':>7} {'wall':>5}"
    )
    print(header)
    for r in results:
        ttfts = sorted(r.ttfts)
        over = (sum(1 for v in ttfts if v > slo) + r.rejected) / max(1, r.requests)  # a rejection misses too
        cap = r.replica_s * plan.per_replica_qps
        print(
            f"{r.config.name:<32} {r.busy_s / r.replica_s:>8.0%} {r.completed / cap:>7.0%} "
            f"{r.replica_s / 3600:>6.2f} {r.peak_replicas:>4} {_quantile(ttfts, 0.5) * 1000:>6.0f}ms "
            f"{_quantile(ttfts, 0.99) * 1000:>5.0f}ms {over:>6.2%} {r.rejected:>6} {r.preemptions:>7} {r.actions:>7} "
            f"{r.wall_s:>4.0f}s"
        )
    base = results[0]
    for r in results[1:]:
        b99, r99 = _quantile(sorted(base.ttfts), 0.99), _quantile(sorted(r.ttfts), 0.99)
        print(
            f"{r.config.name} / baseline: replica-hours x{r.replica_s / base.replica_s:.2f}, "
            f"utilisation x{(r.busy_s / r.replica_s) / (base.busy_s / base.replica_s):.2f}, "
            f"TTFT p99 x{r99 / b99:.2f}"
        )


if __name__ == "__main__":
    main()
