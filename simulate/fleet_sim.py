"""FleetSim: one pool replaying one trace under one routing x scaling configuration, discrete-event, virtual time.

No processes and no HTTP. Each replica is an `engine_sim.scheduler.Scheduler` (the continuous-batching object the
simulated engine serves from, timed by the calibrated `fleet.capacity.perf.StepTimeModel`, with its paged KV cache and
prefix cache); the gateway is `gateway.routing.base.Router` built from the configuration's plugins over
`EndpointView` snapshots, admitting as `gateway.admission.Admission` does (up to
`fleet.capacity.plan.admission_capacity` in flight, the rest wait FIFO up to ``queue.timeoutS`` (then 503), at most
``queue.maxWaiting`` (then 429)); the control loop is `simulate.control.Controller`, the live loop's own decision
step. A launched replica becomes ready ``coldStartSeconds`` later; a replica chosen to go stops taking traffic
at once and stops when its last request finishes (drain). With ``engine.sleepMode`` a decision's ``sleep``
replicas drain the same way and then sleep, holding their GPUs (billed) but serving nothing, and its ``wake``
replicas serve again `simulate.replica.wake_seconds` later.

Events: arrivals, engine step ends, metrics scrapes (every ``SCRAPE_S``: what the gateway's endpoint view and
the agents' reports see; the gateway's own counts (`Replica.sent`) are live; its report, `gateway.reporting`'s
rates, goes out then), queue timeouts and control-loop ticks. While a replica only decodes (nothing waits,
nothing prefills), its steps until the next finish are one event, a decode run (`Scheduler.start_decode_run`):
an arrival routed to it cuts the run after the step running then, a scrape applies the steps that ended before
it. The results are those of one event per step (a test holds them equal); only the order in which ITLs are
recorded differs, and every figure sorts them.

Prompts are token ids built from the trace's prefix blocks (`simulate.prompts`; the request info carries them
for the ``kv-cache`` scorer, whose index the replicas' own KV events feed: `simulate.kvfeed`), replicas are
`simulate.replica`, what a run measured is a `simulate.result.Result`. Requests whose prompt + output exceed
the pool's ``maxModelLen`` are dropped before the replay (vLLM refuses them) and counted.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from control_plane.scaling.context import ReplicaLoad
from control_plane.scaling.decisions import Decision, ScaleDown, ScaleUp
from engine_sim.kv_events import KVEvent
from engine_sim.request import SimRequest
from engine_sim.scheduler import Scheduler
from fleet.capacity.plan import admission_capacity
from fleet.protocol.wire import RATE_WINDOW_S, GatewayReport, ReplicaState
from fleet.spec.stack import FleetSpec, PoolSpec
from gateway.reporting import PoolTraffic
from gateway.routing.base import Router
from simulate.billing import NodeBilling
from simulate.kv_oracle import bind_oracle
from simulate.kvfeed import KV_EVENT_DELAY_S, KvFeed
from simulate.kvpool import build_replica_scheduler, replica_config
from simulate.prompts import prompt_tokens, request_info
from simulate.replica import SCRAPE_S, Replica, add_itls, wake_seconds
from simulate.result import Result, quantile
from simulate.trace import TraceRequest

__all__ = ["FleetSim", "GpuLedger", "Scaler"]

RUN_STEPS = 256  # at most this many decode steps planned at once (a run is cut short when a request arrives)


class GpuLedger(Protocol):
    """GPUs several pools share (`simulate.shared.SharedGroup`): how long a replica launched now takes to serve."""

    def start_s(self, sim: FleetSim) -> float: ...


class Scaler(Protocol):
    """What the simulation asks at each control tick: `simulate.control.Controller` (the live loop's decision step)
    or `simulate.oracle.OracleScaler`. A decision's ``nodes_for`` keeps that many replicas' nodes paid."""

    def step(self, now: float, replicas: tuple[ReplicaLoad, ...], gateway: GatewayReport | None = None) -> Decision: ...


class FleetSim:
    """One pool, one router, one scaler (None: the pool's replicas stay as started), one trace."""

    def __init__(
        self,
        spec: FleetSpec,
        pool: PoolSpec,
        router: Router,
        controller: Scaler | None,
        trace: Sequence[TraceRequest],
        *,
        name: str = "",
        initial_replicas: int | None = None,
        floor_rids: frozenset[str] = frozenset(),
        decode_runs: bool = True,
        gpus: GpuLedger | None = None,
        kv_delay_s: float = KV_EVENT_DELAY_S,
        initial_age_s: float = 0.0,
    ) -> None:
        self.gpus, self.floor_rids = gpus, floor_rids  # gpus: shared with other pools (`simulate.shared`)
        self.run_steps = RUN_STEPS if decode_runs else 0  # 0: every step is its own event (the same results)
        self.spec, self.pool, self.router, self.controller, self.trace = spec, pool, router, controller, trace
        self.initial = pool.replicas.min if initial_replicas is None else initial_replicas
        self.interval_s = spec.autoscaling.interval_s
        self.kv_feed = KvFeed.for_router(router, kv_delay_s)  # None: no kv-cache scorer, the engines record nothing
        self.engine_config = replica_config(spec, pool, kv_events=self.kv_feed is not None)
        self.model = self.engine_config.served_model_name
        self.wake_s = wake_seconds(self.engine_config)
        self.replicas: list[Replica] = []
        self.by_name: dict[str, Replica] = {}
        bind_oracle(router, self.scheduler_of)  # an oracle-kv scorer reads the replicas' prefix caches as they are
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.names = itertools.count()
        self.result = Result(name, initial_age_s=initial_age_s)
        self.queue_cfg = spec.gateway.queue
        self.gw_queue: deque[tuple[int, TraceRequest]] = deque()
        self.gw_queued: set[str] = set()
        self.gw_in_flight = 0
        self.arrived_at: dict[str, float] = {}
        self.traffic = PoolTraffic(samples=deque([(0.0, 0, 0)]))
        self.gw_report: GatewayReport | None = None
        self.tick_ttfts: list[float] = []
        self.billing = NodeBilling.for_pool(spec, pool)
        self.result.gpus_per_replica = pool.engine.tensor_parallel_size
        self.node_room = 0  # replicas the scaler's last decision keeps nodes for (``nodes_for``)
        # (since when, replicas billed, node room) for the node integral
        self.billed_since = (0.0, self.initial, 0)
        self.now = 0.0

    # -- event plumbing ------------------------------------------------------------------------------------
    def push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def launch(self, now: float, ready: bool = False, age_s: float = 0.0) -> None:
        name = f"{self.pool.name}-{next(self.names)}"
        replica = Replica(name, build_replica_scheduler(self.engine_config, now - age_s), launched_at=now)
        if ready:
            replica.state = ReplicaState.READY
        else:  # the ledger counts the GPUs held before this one
            start_s = self.pool.cold_start_seconds if self.gpus is None else self.gpus.start_s(self)
            self.push(now + start_s, "ready", replica)
        self.replicas.append(replica)
        self.by_name[name] = replica

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state != ReplicaState.STOPPED]

    def run(self) -> Result:
        """Replay the whole trace; the result."""
        self.begin()
        while self.events:
            self.handle_next()
        return self.finish()

    def begin(self) -> None:
        """The replicas ready at t=0, every arrival and the first scrape and tick, queued."""
        self.started = time.perf_counter()
        self.end = self.trace[-1].t if self.trace else 0.0
        for _ in range(self.initial):  # up ``initial_age_s`` already: engines age
            self.launch(0.0, ready=True, age_s=self.result.initial_age_s)
        for i, a in enumerate(self.trace):
            self.push(a.t, "arrival", (i, a))
        self.push(0.0, "scrape")
        self.push(self.interval_s, "tick")
        self.handlers: dict[str, Callable[[float, Any], None]] = {
            "arrival": self.on_arrival,
            "step": self.on_step,
            "run": self.on_run,
            "ready": self.on_ready,
            "scrape": self.on_scrape,
            "tick": self.on_tick,
            "queue-timeout": self.on_queue_timeout,
            "kv-events": self.on_kv_events,
        }

    def handle_next(self) -> None:
        """Handle the earliest queued event (there is one)."""
        now, _, kind, payload = heapq.heappop(self.events)
        self.now = now
        if kind in ("scrape", "tick") and now > self.end and not self.gw_queued and not self.gw_in_flight:
            return  # the trace is over and every request has finished: let the clock stop
        self.handlers[kind](now, payload)

    def finish(self) -> Result:
        """Bill up to the last event and total the replicas' time; the result."""
        now = self.now
        self.bill(now, len(self.live()))
        for r in self.replicas:
            stop = r.stopped_at if r.stopped_at is not None else now
            self.result.replica_s += stop - r.launched_at
            self.result.busy_s += r.busy_s
            self.result.replica_busy.append((r.busy_s, stop - r.launched_at))
            self.result.preemptions += r.preemptions
        self.result.wall_s = time.perf_counter() - self.started
        self.result.end_s = now
        return self.result

    # -- the gateway ---------------------------------------------------------------------------------------
    def scheduler_of(self, name: str) -> Scheduler | None:
        """The scheduler replica ``name`` serves from now (`simulate.kv_oracle.OracleKv` reads its cache)."""
        replica = self.by_name.get(name)
        return None if replica is None else replica.scheduler

    def admission_capacity(self) -> int:
        routable = sum(1 for r in self.replicas if r.state == ReplicaState.READY)
        return admission_capacity(routable, self.pool.engine.max_num_seqs, self.queue_cfg.per_replica_threshold)

    def on_arrival(self, now: float, item: tuple[int, TraceRequest]) -> None:
        _, a = item
        self.result.requests += 1
        self.result.floor_requests += a.rid in self.floor_rids
        self.arrived_at[a.rid] = a.t
        self.traffic.arrived += 1
        if not self.gw_queue and self.gw_in_flight < self.admission_capacity():
            self.dispatch(now, item)
        elif len(self.gw_queued) >= self.queue_cfg.max_waiting:
            self.result.rejected += 1
        else:
            self.gw_queue.append(item)
            self.gw_queued.add(a.rid)
            self.push(now + self.queue_cfg.timeout_s, "queue-timeout", a)

    def on_queue_timeout(self, now: float, a: TraceRequest) -> None:
        if a.rid in self.gw_queued:
            self.gw_queued.discard(a.rid)
            self.result.rejected += 1

    def pump(self, now: float) -> None:
        """Admit queued requests while the pool has room (a slot freed, a replica became ready)."""
        capacity = self.admission_capacity()
        while self.gw_queue and self.gw_in_flight < capacity:
            item = self.gw_queue.popleft()
            if item[1].rid in self.gw_queued:
                self.gw_queued.discard(item[1].rid)
                self.dispatch(now, item)

    def dispatch(self, now: float, item: tuple[int, TraceRequest]) -> None:
        index, a = item
        seqs = self.pool.engine.max_num_seqs
        views = [r.view(self.pool.name, self.model, seqs, now) for r in self.replicas if r.state == ReplicaState.READY]
        tokens = prompt_tokens(a, index)
        info = request_info(a, tokens, self.model, now)
        decision = self.router.route(views, info)
        if decision is None:
            self.result.unrouted += 1
            return
        self.traffic.admitted += 1
        replica = self.by_name[decision.endpoint.id]
        if replica.scheduler.in_run:  # the step running now is the run's last: the next one may admit this request
            replica.run_seq += 1
            self.push(replica.scheduler.truncate_decode_run(now), "run", (replica, replica.run_seq))
        replica.scheduler.add(SimRequest(a.rid, tokens, max_tokens=a.output_tokens, cache_salt=a.cache_salt), now)
        replica.sent(a.rid, len(tokens), decision.spared)
        self.gw_in_flight += 1
        self.kick(replica, now)

    # -- the engines ---------------------------------------------------------------------------------------
    def kick(self, r: Replica, now: float) -> None:
        """Start the replica's next step when it is idle and has work: a decode run when it can be one (one event
        for many steps), else a single step."""
        if r.plan is None and not r.scheduler.in_run and r.scheduler.has_work():
            end = r.scheduler.start_decode_run(now, self.run_steps) if self.run_steps else None
            if end is not None:
                r.run_seq += 1
                self.push(end, "run", (r, r.run_seq))
                return
            r.plan = r.scheduler.schedule(now)
            if r.plan is not None:
                self.push(r.plan.end, "step", r)

    def on_step(self, now: float, r: Replica) -> None:
        assert r.plan is not None
        result = r.scheduler.complete(r.plan)
        r.plan = None
        self.publish(r, now)
        res = self.result
        itls = res.itls
        for ev in result.events:
            if ev.first:  # the client's TTFT includes the gateway queue; the agent sees the engine's
                ttft = now - self.arrived_at.pop(ev.request.request_id)
                res.ttfts.append(ttft)
                if ev.request.request_id not in self.floor_rids:
                    res.feasible_ttfts.append(ttft)
                self.tick_ttfts.append(ttft)
                r.ttfts.append((now, ev.latency))
                r.answered(ev.request.request_id)
                res.prompt_tokens += ev.request.num_prompt_tokens
                res.cached_tokens += max(0, ev.request.num_cached_tokens)
            else:
                itls.append(ev.latency)
            if ev.finished is not None:
                r.finished(ev.request.request_id)
                self.gw_in_flight -= 1
                res.completed += 1
        self.kick(r, now)
        if self.gw_queue:
            self.pump(now)
        if r.state == ReplicaState.DRAINING and r.in_flight == 0:
            self.leave(r, now)

    def on_run(self, now: float, item: tuple[Replica, int]) -> None:
        """A decode run's last step ended (no request finished in it: runs stop before a finish)."""
        r, seq = item
        if seq != r.run_seq:
            return  # the run was cut short and has a later event
        add_itls(self.result.itls, r.scheduler.finish_decode_run())
        self.publish(r, now)
        self.kick(r, now)
        if self.gw_queue:
            self.pump(now)

    def publish(self, r: Replica, now: float, cleared: bool = False) -> None:
        """Send what ``r``'s engine recorded since the last publish to the KV index (``cleared``: then forget it)."""
        if self.kv_feed is not None:
            self.kv_feed.publish(self.push, r.name, r.scheduler, now, cleared)

    def on_kv_events(self, now: float, item: tuple[str, list[KVEvent]]) -> None:
        if self.kv_feed is not None:
            self.kv_feed.index.apply(*item)

    def stop(self, r: Replica, now: float) -> None:
        r.state, r.stopped_at = ReplicaState.STOPPED, now

    def leave(self, r: Replica, now: float) -> None:
        """A drained (or idle) replica leaves: it sleeps when chosen to, else it stops. Either way the KV index
        forgets its blocks (after what it published before)."""
        self.publish(r, now, cleared=True)
        if r.to_sleep:
            r.fall_asleep(build_replica_scheduler(self.engine_config, started_at=now))
        else:
            self.stop(r, now)

    def on_ready(self, now: float, r: Replica) -> None:
        if r.state in (ReplicaState.LAUNCHING, ReplicaState.WAKING):
            r.state = ReplicaState.READY
            self.pump(now)

    def carry_out(self, now: float, decision: Decision) -> None:
        """What the actuator does with a scaler's decision: wake and launch, or drain to a stop or to sleep."""
        if isinstance(decision, ScaleUp):
            self.result.actions += 1
            for name in decision.wake:
                r = self.by_name[name]
                if r.state == ReplicaState.SLEEPING:
                    r.state = ReplicaState.WAKING
                    self.result.wakes += 1
                    self.push(now + self.wake_s, "ready", r)
            for _ in range(decision.starts):
                self.launch(now)
        elif isinstance(decision, ScaleDown):
            self.result.actions += 1
            for name in (*decision.victims, *decision.sleep):
                r = self.by_name[name]
                r.to_sleep = name in decision.sleep and r.state == ReplicaState.READY
                if r.state == ReplicaState.LAUNCHING or r.in_flight == 0:
                    self.leave(r, now)
                else:
                    r.state = ReplicaState.DRAINING

    # -- what the agents and the gateway report ------------------------------------------------------------
    def on_scrape(self, now: float, _: Any) -> None:
        for r in self.replicas:
            if r.state in (ReplicaState.READY, ReplicaState.DRAINING):
                r.scrape(now, self.result.itls)
                self.publish(r, now)
        arrived, admitted, span = self.traffic.rates(now, RATE_WINDOW_S)
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

    def loads(self, now: float) -> tuple[ReplicaLoad, ...]:
        return tuple(r.load(now) for r in self.live())

    def bill(self, now: float, replicas: int) -> None:
        """Pay the nodes and GPUs of the replicas billed since the last call up to ``now``; ``replicas`` from now.
        On shared GPUs the group pays instead (`simulate.shared`): only ``billed_since`` is kept, for it to read."""
        since, billed, room = self.billed_since
        if self.gpus is not None:
            self.billed_since = (now, replicas, self.node_room)
            return
        span = max(0.0, now - since)
        billed = max(billed, room)  # nodes ordered ahead (a decision's ``nodes_for``) are paid from the order
        self.result.node_s += self.billing.nodes(billed) * span
        self.result.paid_gpu_s += self.billing.paid_gpus(billed) * span
        self.billed_since = (now, replicas, self.node_room)

    def on_tick(self, now: float, _: Any) -> None:
        if self.controller is not None:
            decision = self.controller.step(now, self.loads(now), self.gw_report)
            self.node_room = decision.nodes_for or 0
            self.carry_out(now, decision)
        billed = len(self.live())
        self.bill(now, billed)
        self.result.peak_replicas = max(self.result.peak_replicas, billed)
        p99 = quantile(sorted(self.tick_ttfts), 0.99) if self.tick_ttfts else float("nan")
        self.tick_ttfts = []
        self.result.timeline.append((now, billed, len(self.gw_queued), p99))
        self.push(now + self.interval_s, "tick")
