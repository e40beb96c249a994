"""Paid floor: the fewest replicas a pool keeps so that the GPUs its node group always pays for serve.

On a target paid by the node (aws) a node group pays for ``minNodesPerAz x zones`` nodes whatever runs on them.
With ``replicas.fillPaidNodes`` (the default) the pools placed on the group fill those nodes: the floor of each is
the most replicas that still pack onto the minimum nodes (`fleet.capacity.paid.nodes_per_zone`: the zone spread,
each replica's ``tensorParallelSize`` GPUs on one node, every pool of the group packed together), so holding it
never adds a node. The pools share the nodes by GPUs held, fewest first (one replica at a time, ties to the
pool listed first); each starts from its ``replicas.min`` and stops at its ``replicas.max``; a pool with
``fillPaidNodes`` off keeps its ``min`` in the packing and takes no share.

Prod (three zones of one p4de.24xlarge, 8 A100s each, one TP=1 pool up to 24): 24 GPUs paid, floor 24; a TP=2
pool: 12. Pools without a node group, or on local and kubernetes targets, have no floor.

Where two or more filling pools share a group whose ``paidSplit`` is ``demand`` the floor moves with their demand
(`moving_floors`, every control tick): the paid GPUs go first to the replicas each pool wants (its guarded desire
before the floor, `Claim`), the least satisfied first, then the rest in proportion to those wants; a pool's floor
rises only into GPUs no pool holds. While pools under their shares want more than the free GPUs give, or the group
holds more GPUs than its minimum pays, a pool holding more than its share is capped at its share or its own want,
whichever is higher (`PaidFloor.cap`), so the GPU it yields passes to the pool that wants it and the group goes back
to its minimum. Before every pool has claimed once the split is `paid_floor`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.capacity.catalog import INSTANCES
from fleet.capacity.paid import nodes_per_zone
from fleet.spec.stack import FleetSpec, GpuNodeGroupSpec, PoolSpec

__all__ = ["Claim", "PaidFloor", "fill_paid_nodes", "moving_floors", "paid_floor"]


@dataclass(frozen=True)
class PaidFloor:
    """A pool's floor: ``replicas`` it keeps, because its node group pays ``paid_gpus`` GPUs at its minimum."""

    replicas: int
    paid_gpus: int
    # at most this many replicas of capacity while another pool of the group wants the GPUs (None: no cap)
    cap: int | None = None


@dataclass(frozen=True)
class Claim:
    """A pool's last tick on a shared group: ``want`` replicas (its guarded desire before the paid floor) while
    it ``held`` ``held`` replicas' GPUs (starting, serving or draining)."""

    want: int
    held: int


def fill_paid_nodes(
    mins: Sequence[int],
    maxes: Sequence[int],
    replica_gpus: Sequence[int],
    filling: Sequence[bool],
    zones: int,
    gpus_per_node: int,
    min_per_zone: int,
    wants: Sequence[int] | None = None,
) -> list[int]:
    """Replicas per pool that fill ``min_per_zone`` nodes of ``gpus_per_node`` GPUs in each of ``zones`` (module
    docstring): pool ``i`` starts at ``mins[i]``; those with ``filling[i]`` grow while one more replica still packs
    onto the minimum nodes and the pool is under ``maxes[i]``: without ``wants`` the one holding the fewest GPUs
    first; with them the one whose want is least satisfied (share of its want held), then, every want met, the
    largest ``(want + 1) / (floor + 1)`` (the rest in proportion to the wants), ties to fewer GPUs, then order."""

    def key(i: int) -> tuple[float, ...]:
        held = floors[i] * replica_gpus[i]
        if wants is None:
            return (held, i)
        if floors[i] < wants[i]:
            return (0, floors[i] / wants[i], held, i)
        return (1, -(wants[i] + 1) / (floors[i] + 1), held, i)

    floors = list(mins)
    while True:
        order = sorted((i for i in range(len(floors)) if filling[i]), key=key)
        for i in order:
            if floors[i] >= maxes[i]:
                continue
            trial = [n + (1 if j == i else 0) for j, n in enumerate(floors)]
            if max(nodes_per_zone(trial, replica_gpus, zones, gpus_per_node, 0), default=0) <= min_per_zone:
                floors = trial
                break
        else:
            return floors


def _on_group(spec: FleetSpec, pool: PoolSpec) -> tuple[list[PoolSpec], GpuNodeGroupSpec, int] | None:
    """The pools packed with ``pool`` on its group (``pool`` itself, not the stack's, where it differs: the
    simulator's copy, a rollout's bounds), the group and its zones; None: nothing is paid by the node for
    ``pool``."""
    if spec.target != "aws" or pool.node_group is None or not pool.replicas.fill_paid_nodes:
        return None
    group = spec.node_group(pool.node_group)
    zones = len(spec.zones_of(group))
    if group.min_nodes_per_az <= 0 or zones == 0:
        return None
    on_group = [pool if p.name == pool.name else p for p in spec.pools if p.node_group == group.name]
    if pool not in on_group:
        on_group.append(pool)
    return on_group, group, zones


def paid_floor(spec: FleetSpec, pool: PoolSpec, claims: Mapping[str, Claim] | None = None) -> PaidFloor | None:
    """``pool``'s share of its node group's minimum nodes; None where nothing is paid by the node (not aws, no
    node group, no minimum) or the pool's ``replicas.fillPaidNodes`` is off. With ``claims`` (each pool's last
    `Claim`) the share moves with the group's demand (`moving_floors`)."""
    found = _on_group(spec, pool)
    if found is None:
        return None
    on_group, group, zones = found
    gpus_per_node, min_per_zone = INSTANCES[group.instance_type].gpu_count, group.min_nodes_per_az
    filling = [p.name for p in on_group if p.replicas.fill_paid_nodes]
    if group.paid_split == "demand" and claims is not None and len(filling) > 1 and set(filling) <= set(claims):
        return moving_floors(on_group, claims, zones, gpus_per_node, min_per_zone)[pool.name]
    floors = fill_paid_nodes(
        [p.replicas.min for p in on_group],
        [p.replicas.max for p in on_group],
        [p.engine.tensor_parallel_size for p in on_group],
        [p.replicas.fill_paid_nodes for p in on_group],
        zones,
        gpus_per_node,
        min_per_zone,
    )
    mine = next(i for i, p in enumerate(on_group) if p.name == pool.name)
    return PaidFloor(floors[mine], min_per_zone * zones * gpus_per_node)


def moving_floors(
    pools: Sequence[PoolSpec], claims: Mapping[str, Claim], zones: int, gpus_per_node: int, min_per_zone: int
) -> dict[str, PaidFloor]:
    """Each of ``pools`` (one group's, every filling one with a claim) its floor and cap this tick (module
    docstring). A pool without ``fillPaidNodes`` keeps its ``min`` in the packing and holds what it holds."""
    paid = min_per_zone * zones * gpus_per_node
    gpus = [p.engine.tensor_parallel_size for p in pools]
    held = [claims[p.name].held if p.name in claims else p.replicas.min for p in pools]
    wants = [min(max(claims[p.name].want, p.replicas.min), p.replicas.max) if p.name in claims else 0 for p in pools]
    filling = [p.replicas.fill_paid_nodes for p in pools]
    shares = fill_paid_nodes(
        [p.replicas.min for p in pools], [p.replicas.max for p in pools], gpus, filling, zones, gpus_per_node,
        min_per_zone, wants,
    )  # fmt: skip
    free = paid - sum(h * g for h, g in zip(held, gpus, strict=True))
    # Pools over their shares yield while the group holds more GPUs than its minimum pays (a pool grew onto a new
    # node) or while pools under their shares want more than the free GPUs give.
    short = sum(max(0, min(wants[j], shares[j]) - held[j]) * gpus[j] for j in range(len(pools)) if filling[j])
    wanting = free < 0 or short > free
    floors = list(shares)
    for i in sorted(range(len(pools)), key=lambda i: (held[i] - shares[i], i)):  # the furthest under its share first
        if filling[i] and shares[i] > held[i]:
            rise = max(0, min(shares[i] - held[i], free // gpus[i]))
            floors[i], free = held[i] + rise, free - rise * gpus[i]
    out = {}
    for i, pool in enumerate(pools):
        cap = max(shares[i], wants[i]) if wanting and held[i] > shares[i] and wants[i] < held[i] else None
        out[pool.name] = PaidFloor(floors[i], paid, cap)
    return out
