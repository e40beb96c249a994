"""Shared GPUs: several pools on one GPU node group, each replaying its own trace, against the same pools on node
groups of their own.

What is modelled on the shared group (``shared``), one awake engine a GPU:

* every GPU of the group's minimum nodes holds a sleeping engine of every pool (started once, put to sleep at
  level 1, their weights in the node's host memory, which the stack check sizes);
* a pool's replica launched while such a *warm* GPU has no awake engine wakes there
  (`simulate.replica.wake_seconds`); beyond the warm GPUs it starts cold (``coldStartSeconds``) on a new node;
* a replica that goes (scale-in, after its drain) sleeps again on its GPU, which any pool may then wake on;
* the group pays whole nodes for the GPUs holding an awake engine of any pool (starting, serving or draining; a
  decision's ``nodes_for`` counts as held), at least ``minNodesPerAz`` in each zone (`simulate.billing`), sampled
  every control interval.

Each pool keeps its own router, scaler and trace (a `FleetSim` each); the sims run in one event order, earliest
first, so a wake sees the GPUs the other pools hold at that moment. The paid floor is off on the shared group:
GPUs beyond what the pools need hold sleeping engines a second away, not idle awake ones.

``separate`` is the same pools, each on a copy of the group of its own (same instance type, zones and minimum),
as the stack would deploy them apart: its own scaler, paid floor and bill (`FleetSim` alone).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.spec.stack import FleetSpec, PoolSpec
from simulate.billing import NodeBilling
from simulate.configs import Config, make_controller, make_router
from simulate.control import Controller
from simulate.fleet_sim import FleetSim
from simulate.replay import Prepared
from simulate.result import Result

__all__ = ["SharedGroup", "SharedRun", "run_separate", "run_shared", "separate_spec", "shared_spec"]


@dataclass
class SharedGroup:
    """The GPUs of one node group that several pools' sims share: it bills them and times each launch."""

    billing: NodeBilling  # the group's, by the GPU (tensor_parallel 1)
    sims: list[FleetSim] = field(default_factory=list)
    interval_s: float = 10.0
    cold_start_s: dict[str, float] = field(default_factory=dict)  # each pool's start on a GPU without its engine
    node_s: float = 0.0
    paid_gpu_s: float = 0.0
    wakes: int = 0

    @property
    def warm_gpus(self) -> int:
        """The GPUs of the group's minimum nodes: each holds a sleeping engine of every pool."""
        return self.billing.paid_gpus(0)

    def held_gpus(self) -> int:
        """GPUs holding an awake engine of any pool (or kept for one by a decision's ``nodes_for``)."""
        return sum(max(len(s.live()), s.node_room) * s.pool.engine.tensor_parallel_size for s in self.sims)

    def start_s(self, sim: FleetSim) -> float:
        """A wake on a free warm GPU, else a cold start (`simulate.fleet_sim.GpuLedger`)."""
        awake = sum(len(s.live()) * s.pool.engine.tensor_parallel_size for s in self.sims)
        if awake + sim.pool.engine.tensor_parallel_size <= self.warm_gpus:
            self.wakes += 1
            return sim.wake_s
        return self.cold_start_s[sim.pool.name]

    def _bill(self) -> None:
        held = self.held_gpus()
        self.node_s += self.billing.nodes(held) * self.interval_s
        self.paid_gpu_s += self.billing.paid_gpus(held) * self.interval_s

    def run(self) -> list[Result]:
        """Replay every pool's trace together; each pool's result (its paid columns stay 0: the group pays)."""
        for sim in self.sims:
            sim.begin()
        billed_to = 0.0
        while busy := [s for s in self.sims if s.events]:
            sim = min(busy, key=lambda s: s.events[0][0])
            while sim.events[0][0] >= billed_to + self.interval_s:  # what is held now is held until this event
                self._bill()
                billed_to += self.interval_s
            sim.handle_next()
        return [sim.finish() for sim in self.sims]


@dataclass(frozen=True)
class SharedRun:
    """One way of running the pools: each pool's result and what the GPUs of all of them were paid."""

    name: str
    results: tuple[Result, ...]
    paid_gpu_s: float
    node_s: float
    wakes: int
    wall_s: float


def shared_spec(spec: FleetSpec, pools: Sequence[PoolSpec], *, wake: bool) -> FleetSpec:
    """``spec`` with ``pools`` (the prepared copies) on their common group; with ``wake`` the paid floor and the
    pools' own sleep mode off (the group's warm GPUs model it)."""
    groups = {p.node_group for p in pools}
    if len(groups) != 1 or None in groups:
        raise ValueError(f"pools {', '.join(p.name for p in pools)} must share one GPU node group; they name {groups}")
    if wake:  # no floor, and a replica that goes sleeps behind the GPU's next engine, not on a GPU of its own
        pools = [
            p.model_copy(
                update={
                    "replicas": p.replicas.model_copy(update={"fill_paid_nodes": False}),
                    "engine": p.engine.model_copy(update={"sleep_mode": False}),
                }
            )
            for p in pools
        ]
    return spec.model_copy(update={"pools": list(pools)})


def separate_spec(spec: FleetSpec, pools: Sequence[PoolSpec]) -> FleetSpec:
    """``spec`` with each of ``pools`` on a copy of its group of its own, named ``<group>-<pool>``."""
    groups, moved = [], []
    for pool in pools:
        assert pool.node_group is not None
        group = spec.node_group(pool.node_group)
        groups.append(group.model_copy(update={"name": f"{group.name}-{pool.name}"}))
        moved.append(pool.model_copy(update={"node_group": groups[-1].name}))
    return spec.model_copy(update={"gpu_node_groups": groups, "pools": moved})


def _sim(
    spec: FleetSpec, pool: PoolSpec, p: Prepared, config: Config, seed: int, gpus: SharedGroup | None = None
) -> FleetSim:
    controller = make_controller(spec, pool, config.scaling)
    floor = 0 if controller is None or controller.paid is None else controller.paid.replicas
    return FleetSim(
        spec,
        pool,
        make_router(spec, config.routing, seed),
        controller,
        p.trace,
        name=f"{pool.name}: {config.name}",
        initial_replicas=p.fixed_replicas if controller is None else max(p.initial_replicas, floor),
        floor_rids=p.floor_rids,
        gpus=gpus,
    )


def run_shared(
    spec: FleetSpec, prepared: Sequence[Prepared], config: Config, seed: int, *, wake: bool = False
) -> SharedRun:
    """The pools on one shared group (see the module docstring): ``wake`` False, as deployed today; True, as
    modelled with sleeping engines behind every warm GPU."""
    start = time.perf_counter()
    shared = shared_spec(spec, [p.pool for p in prepared], wake=wake)
    first = shared.pools[0]
    billing = NodeBilling.for_pool(shared, first.model_copy(update={"engine": first.engine.model_copy(
        update={"tensor_parallel_size": 1})}))  # fmt: skip
    cold = {pool.name: pool.cold_start_seconds for pool in shared.pools}
    group = SharedGroup(billing, interval_s=shared.autoscaling.interval_s, cold_start_s=cold)
    pairs = zip(shared.pools, prepared, strict=True)
    group.sims = [_sim(shared, pool, p, config, seed, gpus=group) for pool, p in pairs]
    for sim in group.sims:
        # The scaler leads by the start its replicas get: a wake on a warm GPU, not a cold start.
        if wake and isinstance(sim.controller, Controller):
            sim.controller.pool = sim.controller.pool.model_copy(update={"cold_start_seconds": sim.wake_s})
    results = group.run()
    name = "shared+wake" if wake else "shared"
    return SharedRun(name, tuple(results), group.paid_gpu_s, group.node_s, group.wakes, time.perf_counter() - start)


def run_separate(spec: FleetSpec, prepared: Sequence[Prepared], config: Config, seed: int) -> SharedRun:
    """Each pool alone on a group of its own."""
    start = time.perf_counter()
    apart = separate_spec(spec, [p.pool for p in prepared])
    results = tuple(_sim(apart, pool, p, config, seed).run() for pool, p in zip(apart.pools, prepared, strict=True))
    paid, nodes = sum(r.paid_gpu_s for r in results), sum(r.node_s for r in results)
    return SharedRun("separate", results, paid, nodes, 0, time.perf_counter() - start)
