"""Shared GPUs: several pools on one GPU node group, each replaying its own trace, against the same pools on node
groups of their own.

The ways (`WAYS`), each pool with the stack's own router and scaler:

* ``separate``: each pool on a copy of the group of its own (same instance type, zones and minimum), as two
  stacks would deploy them: its own scaler, paid floor and bill (`FleetSim` alone).
* ``fixed``: both on the one group, the group's paid GPUs split between the pools once, at deploy
  (``paidSplit: even``, the default).
* ``shared``: both on the one group, the split moved every tick by the pools' claims, as the live loop moves it
  with ``paidSplit: demand`` (`fleet.capacity.paid_floor.moving_floors`): a GPU passes from one pool to the other
  by a drain and a cold start.
* ``shared+wake``: ``shared`` with one awake engine a GPU and the other pools' engines asleep behind it: every
  GPU of the group's minimum nodes holds a sleeping engine of every pool (started once, put to sleep at level 1,
  their weights in the node's host memory, which the stack check sizes), so a launch while such a *warm* GPU has
  no awake engine wakes there (`simulate.replica.wake_seconds`) instead of starting cold; beyond the warm GPUs it
  starts cold (``coldStartSeconds``) on a new node. Not deployable yet: the agent runs one engine, and a GPU
  belongs to one pod.

On the shared group the GPUs holding an awake engine of any pool (starting, serving or draining; a decision's
``nodes_for`` counts as held) are billed by the whole node, at least ``minNodesPerAz`` in each zone
(`simulate.billing`), sampled every control interval. Each pool keeps its own `FleetSim`; the sims run in one
event order, earliest first, so a start sees the GPUs the other pools hold at that moment and a tick the claims
the other pools made last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from control_plane.scaling.decisions import claim_of
from fleet.capacity.paid_floor import Claim, PaidFloor, paid_floor
from fleet.spec.stack import FleetSpec, PoolSpec
from simulate.billing import NodeBilling
from simulate.configs import Config, make_controller, make_router
from simulate.control import Controller
from simulate.fleet_sim import FleetSim
from simulate.replay import Prepared
from simulate.result import Result

__all__ = ["WAYS", "SharedGroup", "SharedRun", "run_separate", "run_shared", "run_way", "separate_spec", "shared_spec"]

WAYS = ("separate", "fixed", "shared", "shared+wake")


@dataclass
class SharedGroup:
    """The GPUs of one node group that several pools' sims share: it bills them and times each launch."""

    billing: NodeBilling  # the group's, by the GPU (tensor_parallel 1)
    sims: list[FleetSim] = field(default_factory=list)
    interval_s: float = 10.0
    cold_start_s: dict[str, float] = field(default_factory=dict)  # each pool's start on a GPU without its engine
    wake: bool = False  # the warm GPUs hold a sleeping engine of every pool (``shared+wake``)
    node_s: float = 0.0
    paid_gpu_s: float = 0.0
    wakes: int = 0

    @property
    def warm_gpus(self) -> int:
        """The GPUs of the group's minimum nodes: each holds a sleeping engine of every pool."""
        return self.billing.paid_gpus(0)

    def claims(self) -> dict[str, Claim]:
        """Each pool's claim on the paid GPUs, from its scaler's last decision (`control_plane.loop` reads the same)."""
        found = {}
        for sim in self.sims:
            last = getattr(sim.controller, "last", None)
            if last is not None and (claim := claim_of(last)) is not None:
                found[sim.pool.name] = claim
        return found

    def floor_of(self, spec: FleetSpec, sim: FleetSim) -> PaidFloor | None:
        """``sim``'s paid floor this tick, moved by the group's claims."""
        return paid_floor(spec, sim.pool, self.claims())

    def held_gpus(self) -> int:
        """GPUs holding an awake engine of any pool (or kept for one by a decision's ``nodes_for``)."""
        return sum(max(len(s.live()), s.node_room) * s.pool.engine.tensor_parallel_size for s in self.sims)

    def start_s(self, sim: FleetSim) -> float:
        """A wake on a free warm GPU, else a cold start (`simulate.fleet_sim.GpuLedger`)."""
        awake = sum(len(s.live()) * s.pool.engine.tensor_parallel_size for s in self.sims)
        if self.wake and awake + sim.pool.engine.tensor_parallel_size <= self.warm_gpus:
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


def shared_spec(spec: FleetSpec, pools: Sequence[PoolSpec], *, wake: bool, split: str = "even") -> FleetSpec:
    """``spec`` with ``pools`` (the prepared copies) on their common group, its ``paidSplit`` ``split``; with
    ``wake`` the pools' own sleep mode off (the group's warm GPUs model it: a replica that goes frees its GPU for
    any pool to wake on)."""
    groups = {p.node_group for p in pools}
    if len(groups) != 1 or None in groups:
        raise ValueError(f"pools {', '.join(p.name for p in pools)} must share one GPU node group; they name {groups}")
    if wake:  # a replica that goes sleeps behind the GPU's next engine, not on a GPU of its own
        pools = [p.model_copy(update={"engine": p.engine.model_copy(update={"sleep_mode": False})}) for p in pools]
    node_groups = [g.model_copy(update={"paid_split": split}) if g.name in groups else g for g in spec.gpu_node_groups]
    return spec.model_copy(update={"pools": list(pools), "gpu_node_groups": node_groups})


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


def run_shared(spec: FleetSpec, prepared: Sequence[Prepared], config: Config, seed: int, *, way: str) -> SharedRun:
    """The pools on one shared group, ``way`` one of ``fixed``, ``shared``, ``shared+wake`` (module docstring)."""
    start = time.perf_counter()
    wake = way == "shared+wake"
    shared = shared_spec(spec, [p.pool for p in prepared], wake=wake, split="even" if way == "fixed" else "demand")
    first = shared.pools[0]
    billing = NodeBilling.for_pool(shared, first.model_copy(update={"engine": first.engine.model_copy(
        update={"tensor_parallel_size": 1})}))  # fmt: skip
    cold = {pool.name: pool.cold_start_seconds for pool in shared.pools}
    group = SharedGroup(billing, interval_s=shared.autoscaling.interval_s, cold_start_s=cold, wake=wake)
    pairs = zip(shared.pools, prepared, strict=True)
    group.sims = [_sim(shared, pool, p, config, seed, gpus=group) for pool, p in pairs]
    for sim in group.sims:
        if way != "fixed" and isinstance(sim.controller, Controller):
            sim.controller.paid_now = lambda sim=sim: group.floor_of(shared, sim)
    results = group.run()
    return SharedRun(way, tuple(results), group.paid_gpu_s, group.node_s, group.wakes, time.perf_counter() - start)


def run_way(spec: FleetSpec, prepared: Sequence[Prepared], config: Config, seed: int, way: str) -> SharedRun:
    """One of `WAYS`; ValueError naming the allowed ones for another."""
    if way == "separate":
        return run_separate(spec, prepared, config, seed)
    if way not in WAYS:
        raise ValueError(f"--ways: {way!r} is not a way; allowed: {', '.join(WAYS)}")
    return run_shared(spec, prepared, config, seed, way=way)


def run_separate(spec: FleetSpec, prepared: Sequence[Prepared], config: Config, seed: int) -> SharedRun:
    """Each pool alone on a group of its own."""
    start = time.perf_counter()
    apart = separate_spec(spec, [p.pool for p in prepared])
    results = tuple(_sim(apart, pool, p, config, seed).run() for pool, p in zip(apart.pools, prepared, strict=True))
    paid, nodes = sum(r.paid_gpu_s for r in results), sum(r.node_s for r in results)
    return SharedRun("separate", results, paid, nodes, 0, time.perf_counter() - start)
