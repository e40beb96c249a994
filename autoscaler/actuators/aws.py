"""AwsActuator (``aws``): GPU node groups follow the replica count; pods scale through Kubernetes.

For a pool on node group G spread over zones Z1..Zk (one EKS managed node group per zone in cluster
``llmfleet-{environment}``, found by the tags the Pulumi program puts on them, ``llmfleet.io/gpu-group: G`` and
``llmfleet.io/zone: Z``, `fleet.contract`; untagged clusters fall back to the names ``{group}-{zone}``):

    nodes        = ceil(target / replicas_per_node)       replicas_per_node = GPUs per instance // TP
    per zone     = nodes spread evenly, clamped to the node group's own [minSize, maxSize]
    eks.update_nodegroup_config(clusterName, nodegroupName, scalingConfig={minSize, maxSize, desiredSize})

Scale-up grows nodes before pods (pods would sit Pending otherwise); scale-down removes pods first (they drain)
and shrinks nodes after. boto3 is synchronous, so calls run in a worker thread. The EKS client is injected
(``env.eks_client``) and pod scaling is delegated to an inner actuator (``env.pods``; ``kubernetes`` by default).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from autoscaler.actuators import Actuator, ActuatorEnv, FleetView
from autoscaler.actuators.kubernetes import KubernetesActuator
from autoscaler.decisions import Decision, ScaleDown, ScaleUp
from fleet import contract
from fleet.catalog import INSTANCES
from fleet.contract import TAG_GPU_GROUP, TAG_ZONE
from fleet.spec import FleetSpec, PoolSpec

__all__ = ["TAG_GPU_GROUP", "TAG_ZONE", "AwsActuator", "spread"]


def spread(total: int, zones: int) -> list[int]:
    """``total`` split over ``zones`` as evenly as possible, earlier zones first: spread(5, 3) == [2, 2, 1]."""
    base, extra = divmod(total, zones)
    return [base + (1 if i < extra else 0) for i in range(zones)]


class AwsActuator(Actuator, name="aws"):
    def __init__(
        self,
        spec: FleetSpec,
        eks: Any,
        pods: Actuator | None,
        cluster_name: str | None = None,
        nodegroup_template: str = "{group}-{zone}",
    ) -> None:
        self.spec = spec
        self.eks = eks
        self.pods = pods
        self.cluster = cluster_name or contract.cluster_name(spec.environment)
        self.template = nodegroup_template
        self.updates: list[dict[str, Any]] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        eks = env.eks_client
        if eks is None:
            import boto3

            eks = boto3.client("eks", region_name=spec.region)
        pods = env.pods
        if pods is None and env.scale_pods:
            pods = KubernetesActuator.from_spec(spec, env)
        return cls(spec, eks, pods)

    def replicas_per_node(self, pool: PoolSpec) -> int:
        group = self.spec.node_group(self._group(pool))
        return max(1, INSTANCES[group.instance_type].gpu_count // pool.engine.tensor_parallel_size)

    @staticmethod
    def _group(pool: PoolSpec) -> str:
        if pool.node_group is None:
            raise ValueError(f"pool {pool.name!r} has no nodeGroup; the aws actuator needs one")
        return pool.node_group

    def _tagged(self) -> dict[tuple[str, str], str]:
        """(gpu group, zone) -> node group name, from the cluster's node group tags."""
        found: dict[tuple[str, str], str] = {}
        paginator = self.eks.get_paginator("list_nodegroups")
        for page in paginator.paginate(clusterName=self.cluster):
            for name in page.get("nodegroups", []):
                tags = self.eks.describe_nodegroup(clusterName=self.cluster, nodegroupName=name)["nodegroup"].get(
                    "tags", {}
                )
                if TAG_GPU_GROUP in tags and TAG_ZONE in tags:
                    found[(tags[TAG_GPU_GROUP], tags[TAG_ZONE])] = name
        return found

    async def nodegroups(self, pool: PoolSpec) -> list[str]:
        """The pool's node group in each of its zones, in zone order."""
        group = self.spec.node_group(self._group(pool))
        tagged = await asyncio.to_thread(self._tagged)
        return [
            tagged.get((group.name, zone)) or self.template.format(group=group.name, zone=zone)
            for zone in self.spec.zones_of(group)
        ]

    async def resize_nodes(self, pool: PoolSpec, replicas: int) -> list[int]:
        """Set each zone's node group desired size for ``replicas``; returns the sizes set."""
        names = await self.nodegroups(pool)
        wanted = spread(math.ceil(replicas / self.replicas_per_node(pool)), len(names))
        sizes = []
        for name, want in zip(names, wanted, strict=True):
            described = await asyncio.to_thread(
                self.eks.describe_nodegroup, clusterName=self.cluster, nodegroupName=name
            )
            scaling = described["nodegroup"]["scalingConfig"]
            size = min(max(want, int(scaling["minSize"])), int(scaling["maxSize"]))
            config = {"minSize": int(scaling["minSize"]), "maxSize": int(scaling["maxSize"]), "desiredSize": size}
            await asyncio.to_thread(
                self.eks.update_nodegroup_config, clusterName=self.cluster, nodegroupName=name, scalingConfig=config
            )
            self.updates.append({"nodegroup": name, **config})
            sizes.append(size)
        return sizes

    async def current(self, pool: PoolSpec) -> FleetView:
        if self.pods is not None:
            return await self.pods.current(pool)
        return FleetView(0)

    async def apply(self, decision: Decision) -> None:
        pool = self.spec.pool(decision.pool)
        if isinstance(decision, ScaleUp):
            await self.resize_nodes(pool, decision.target)
            if self.pods is not None:
                await self.pods.apply(decision)
        elif isinstance(decision, ScaleDown):
            if self.pods is not None:
                await self.pods.apply(decision)
            await self.resize_nodes(pool, decision.target)

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
