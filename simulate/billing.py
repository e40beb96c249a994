"""Billing: what a pool's replicas are paid as at one moment, the way AWS bills them.

A pool on a GPU node group pays whole nodes, by the rule `llmfleet plan` prices them with
(`fleet.capacity.paid.nodes_per_zone`: per zone, the larger of ``minNodesPerAz`` and the nodes its replicas of
``tensorParallelSize`` GPUs pack onto, spread over the group's zones as a zone topology spread places them).
A pool without a node group runs on an existing cluster's GPUs and pays the GPUs its replicas hold.
The count follows the replicas billed at each control tick (launching and draining ones included), or the
``nodes_for`` of the scaler's decision when larger (nodes ordered ahead of their replicas are paid from the
order): a node is paid from the tick it is ordered or its first replica is launched to the tick its last one
stopped, with no reclaim delay, so the figures are a lower bound on what the same decisions would cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.capacity.catalog import INSTANCES
from fleet.capacity.paid import nodes_per_zone
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["NodeBilling"]


@dataclass(frozen=True)
class NodeBilling:
    """Paid nodes and GPUs of one pool as a function of its replica count."""

    tensor_parallel: int
    gpus_per_node: int = 0  # 0: no node group, paid by the GPU
    zones: int = 1
    min_nodes_per_az: int = 0

    @classmethod
    def for_pool(cls, spec: FleetSpec, pool: PoolSpec) -> NodeBilling:
        tp = pool.engine.tensor_parallel_size
        if pool.node_group is None:
            return cls(tp)
        group = spec.node_group(pool.node_group)
        gpus = INSTANCES[group.instance_type].gpu_count
        return cls(tp, gpus, len(spec.zones_of(group)), group.min_nodes_per_az)

    def nodes(self, replicas: int) -> int:
        """Nodes paid while ``replicas`` run (0 on an existing cluster: no node is the pool's own)."""
        if not self.gpus_per_node:
            return 0
        per_zone = nodes_per_zone(
            [replicas], [self.tensor_parallel], self.zones, self.gpus_per_node, self.min_nodes_per_az
        )
        return sum(per_zone)

    def paid_gpus(self, replicas: int) -> int:
        """GPUs paid while ``replicas`` run: whole nodes, or the replicas' own GPUs without a node group."""
        if not self.gpus_per_node:
            return replicas * self.tensor_parallel
        return self.nodes(replicas) * self.gpus_per_node
