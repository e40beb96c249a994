"""ScalingContext: the frozen snapshot of one pool that policies and guard-rails decide from.

Built once per loop tick by `build_context`; nothing in it performs I/O and ``now`` is passed in, so the same
policy code runs live, in tests with explicit times, and in simulation.

Replica states seen here: an agent state (``fetching``, ``starting``, ``warming``, ``ready``, ``draining``,
``stopped``, ``restarting``, ``failed``) or ``launching`` (the actuator started it and no report has arrived
yet). A replica whose last report is older than the stale limit is ``stale``: its load is *unknown*, which is
never the same as zero; it counts neither as idle capacity nor as load.

Gateways report what no engine sees: requests waiting in their admission queues and the rate requests arrive
(`fleet.protocol.wire.GatewayReport`). ``gateway_waiting`` and ``request_rate`` sum the *fresh* gateway reports; both
are
None when no gateway reported recently (unknown, never zero), and ``gateways_stale`` counts gateways whose
reports stopped (their share is unknown, so the sums are then a lower bound). ``per_replica_qps`` is the pool's
planned at-SLO capacity per replica (`fleet.capacity.plan.plan_pool`), fixed when the loop is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.capacity.paid_floor import PaidFloor
from fleet.protocol.wire import ReplicaState
from fleet.spec.stack import AutoscalingSpec, PoolSpec

__all__ = ["ARRIVING_STATES", "ReplicaLoad", "ScalingContext", "build_context"]

# States of replicas that will take traffic soon: capacity already on its way (cold-start awareness).
ARRIVING_STATES = frozenset(
    {
        ReplicaState.LAUNCHING,
        ReplicaState.FETCHING,
        ReplicaState.STARTING,
        ReplicaState.WARMING,
        ReplicaState.RESTARTING,
        ReplicaState.WAKING,
    }
)


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as the loop sees it. Load fields are None when unknown (no report or failed scrape)."""

    replica: str
    state: ReplicaState
    stale: bool = False
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    ttft_p99_s: float | None = None
    tokens_per_s: float | None = None
    report_age_s: float | None = None

    @property
    def has_metrics(self) -> bool:
        return self.waiting is not None and self.running is not None

    @property
    def load(self) -> float:
        """Requests in the replica (running + waiting); +inf when unknown so it is never picked as 'idle'."""
        if not self.has_metrics:
            return math.inf
        assert self.waiting is not None and self.running is not None
        return self.waiting + self.running


@dataclass(frozen=True)
class ScalingContext:
    """Everything a scaling policy may read about one pool at time ``now``."""

    # identity and time
    pool: str
    now: float
    # current state: every replica the pool runs, including ones still launching and ones draining
    replicas: tuple[ReplicaLoad, ...]
    # bounds
    min_replicas: int
    max_replicas: int
    # the floor the GPUs its node group always pays for set (`fleet.capacity.paid_floor`; 0: none) and those GPUs
    paid_floor: int = 0
    paid_gpus: int = 0
    # a shared group's cap while another pool wants the GPUs held beyond this pool's share (None: none)
    paid_cap: int | None = None
    # targets (from the stack's autoscaling and pool specs)
    target_queue_per_replica: float = 4.0
    target_kv_usage: float = 0.75
    target_utilisation: float = 0.75
    max_num_seqs: int = 256
    ttft_slo_s: float = 0.3
    # timing
    cold_start_s: float = 120.0
    # how much longer a replica that needs a new node takes to serve (its GPU group's nodeColdStartSeconds;
    # 0: nodes are not provisioned ahead, as on the local and Kubernetes actuators)
    node_lead_s: float = 0.0
    # the gateways' view (None: unknown) and the plan's per-replica capacity (None: no plan)
    gateway_waiting: float | None = None
    request_rate: float | None = None
    gateways_stale: int = 0
    per_replica_qps: float | None = None
    # demand (running + waiting over fresh replicas) per past tick: ((t, value), ...) oldest first
    demand_history: tuple[tuple[float, float], ...] = ()
    # replicas that died within a cold start (`control_plane.scaling.departures`): a replacement is on its way
    replacing: tuple[str, ...] = ()
    # the state the policy returned last tick, its own only: the guard-rails keep theirs apart (its parameters
    # are its own too, fixed when it is built)
    state: Mapping[str, Any] = field(default_factory=dict)

    # -- replica groups -------------------------------------------------------------------------------------
    @property
    def fresh_ready(self) -> tuple[ReplicaLoad, ...]:
        """Ready replicas with a recent report: the only ones whose load the policies may read."""
        return tuple(r for r in self.replicas if r.state == ReplicaState.READY and not r.stale)

    @property
    def arriving(self) -> tuple[ReplicaLoad, ...]:
        """Replicas starting up (not stale): capacity that is on its way."""
        return tuple(r for r in self.replicas if r.state in ARRIVING_STATES and not r.stale)

    @property
    def draining(self) -> tuple[ReplicaLoad, ...]:
        return tuple(r for r in self.replicas if r.state in (ReplicaState.DRAINING, ReplicaState.STOPPED))

    @property
    def unknown(self) -> tuple[ReplicaLoad, ...]:
        """Replicas whose load is unknown: stale (reports stopped) or ready without metrics (scrape failed)."""
        return tuple(
            r
            for r in self.replicas
            if r.state not in (ReplicaState.DRAINING, ReplicaState.STOPPED, ReplicaState.FAILED)
            and (r.stale or (r.state == ReplicaState.READY and not r.has_metrics))
        )

    @property
    def failed(self) -> tuple[ReplicaLoad, ...]:
        """Replicas their agent gave up on (crash loop): known to serve nothing, first to go on a scale-down."""
        return tuple(r for r in self.replicas if r.state == ReplicaState.FAILED and not r.stale)

    @property
    def current(self) -> int:
        """Replicas the pool runs and will keep (everything but draining ones, and sleeping ones, which serve
        nothing until woken)."""
        gone = (ReplicaState.DRAINING, ReplicaState.STOPPED, ReplicaState.SLEEPING)
        return sum(1 for r in self.replicas if r.state not in gone)

    @property
    def asleep(self) -> tuple[ReplicaLoad, ...]:
        """Sleeping replicas (sleep mode): a scale-up wakes these before it starts new ones."""
        return tuple(r for r in self.replicas if r.state == ReplicaState.SLEEPING and not r.stale)

    @property
    def capacity(self) -> int:
        """Replicas that serve or will soon serve: fresh ready ones with metrics plus arriving ones."""
        return sum(1 for r in self.fresh_ready if r.has_metrics) + len(self.arriving)

    # -- aggregate load over fresh replicas with metrics ---------------------------------------------------
    def _measured(self) -> Sequence[ReplicaLoad]:
        return [r for r in self.fresh_ready if r.has_metrics]

    @property
    def has_metrics(self) -> bool:
        return bool(self._measured())

    @property
    def engine_waiting(self) -> float:
        """Requests waiting inside the engines (the agents' reports)."""
        return sum(r.waiting or 0.0 for r in self._measured())

    @property
    def queue_depth(self) -> float:
        """Requests waiting for a batch slot: in the engines plus in the gateways' admission queues (when known)."""
        return self.engine_waiting + (self.gateway_waiting or 0.0)

    @property
    def running(self) -> float:
        return sum(r.running or 0.0 for r in self._measured())

    @property
    def kv_usage_total(self) -> float:
        """Sum of KV usage fractions (1.0 = one full replica) over replicas that report it."""
        return sum(r.kv_usage for r in self._measured() if r.kv_usage is not None)

    @property
    def ttft_p99_s(self) -> float | None:
        """Worst P99 TTFT over fresh replicas, None when no replica reports one."""
        values = [r.ttft_p99_s for r in self._measured() if r.ttft_p99_s is not None]
        return max(values) if values else None

    @property
    def demand(self) -> float:
        return self.queue_depth + self.running


def build_context(
    pool: PoolSpec,
    autoscaling: AutoscalingSpec,
    replicas: tuple[ReplicaLoad, ...],
    now: float,
    *,
    gateway: tuple[float | None, float | None, int] = (None, None, 0),
    per_replica_qps: float | None = None,
    demand_history: tuple[tuple[float, float], ...] = (),
    state: Mapping[str, Any] | None = None,
    node_lead_s: float = 0.0,
    paid: PaidFloor | None = None,
    replacing: tuple[str, ...] = (),
) -> ScalingContext:
    """The context of one pool at ``now``: the spec's targets and bounds plus the observed load.

    ``gateway`` is ``(waiting, request_rate, stale_gateways)`` as `control_plane.reports.gateway_demand` sums it;
    ``paid`` is the pool's `fleet.capacity.paid_floor.paid_floor` (None: no floor); ``replacing`` the replicas that
    died recently (`control_plane.scaling.departures.Departures.replacing`). The live loop and the fleet
    simulation both build contexts here, so they decide from the same fields.
    """
    return ScalingContext(
        pool=pool.name,
        now=now,
        replicas=replicas,
        min_replicas=pool.replicas.min,
        max_replicas=pool.replicas.max,
        paid_floor=0 if paid is None else paid.replicas,
        paid_gpus=0 if paid is None else paid.paid_gpus,
        paid_cap=None if paid is None else paid.cap,
        target_queue_per_replica=autoscaling.target_queue_per_replica,
        target_kv_usage=autoscaling.target_kv_usage,
        target_utilisation=autoscaling.target_utilisation,
        max_num_seqs=pool.engine.max_num_seqs,
        ttft_slo_s=pool.slo.ttft_p99_ms / 1000.0,
        cold_start_s=pool.cold_start_seconds,
        node_lead_s=node_lead_s,
        gateway_waiting=gateway[0],
        request_rate=gateway[1],
        gateways_stale=gateway[2],
        per_replica_qps=per_replica_qps,
        demand_history=demand_history,
        replacing=replacing,
        state=state if state is not None else {},
    )
