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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.capacity.catalog import INSTANCES
from fleet.capacity.paid import nodes_per_zone
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["PaidFloor", "fill_paid_nodes", "paid_floor"]


@dataclass(frozen=True)
class PaidFloor:
    """A pool's floor: ``replicas`` it keeps, because its node group pays ``paid_gpus`` GPUs at its minimum."""

    replicas: int
    paid_gpus: int


def fill_paid_nodes(
    mins: Sequence[int],
    maxes: Sequence[int],
    replica_gpus: Sequence[int],
    filling: Sequence[bool],
    zones: int,
    gpus_per_node: int,
    min_per_zone: int,
) -> list[int]:
    """Replicas per pool that fill ``min_per_zone`` nodes of ``gpus_per_node`` GPUs in each of ``zones`` (module
    docstring): pool ``i`` starts at ``mins[i]``; those with ``filling[i]`` grow, the one holding the fewest GPUs
    first, while one more replica still packs onto the minimum nodes and the pool is under ``maxes[i]``."""
    floors = list(mins)
    while True:
        order = sorted((floors[i] * replica_gpus[i], i) for i in range(len(floors)) if filling[i])
        for _, i in order:
            if floors[i] >= maxes[i]:
                continue
            trial = [n + (1 if j == i else 0) for j, n in enumerate(floors)]
            if max(nodes_per_zone(trial, replica_gpus, zones, gpus_per_node, 0), default=0) <= min_per_zone:
                floors = trial
                break
        else:
            return floors


def paid_floor(spec: FleetSpec, pool: PoolSpec) -> PaidFloor | None:
    """``pool``'s share of its node group's minimum nodes; None where nothing is paid by the node (not aws, no
    node group, no minimum) or the pool's ``replicas.fillPaidNodes`` is off."""
    if spec.target != "aws" or pool.node_group is None or not pool.replicas.fill_paid_nodes:
        return None
    group = spec.node_group(pool.node_group)
    zones = len(spec.zones_of(group))
    if group.min_nodes_per_az <= 0 or zones == 0:
        return None
    gpus_per_node = INSTANCES[group.instance_type].gpu_count
    # ``pool`` itself, not the stack's, where it differs (the simulator's copy, a rollout's bounds)
    on_group = [pool if p.name == pool.name else p for p in spec.pools if p.node_group == group.name]
    if pool not in on_group:
        on_group.append(pool)
    floors = fill_paid_nodes(
        [p.replicas.min for p in on_group],
        [p.replicas.max for p in on_group],
        [p.engine.tensor_parallel_size for p in on_group],
        [p.replicas.fill_paid_nodes for p in on_group],
        zones,
        gpus_per_node,
        group.min_nodes_per_az,
    )
    mine = next(i for i, p in enumerate(on_group) if p.name == pool.name)
    return PaidFloor(floors[mine], group.min_nodes_per_az * zones * gpus_per_node)
