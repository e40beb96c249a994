"""FleetSpec: the typed model of a stack file's ``llmfleet:*`` keys.

Every runtime part (gateway, agent, autoscaler, simulator) and the Pulumi program read this one model.
Keys are camelCase in YAML (``gpuMemoryUtilization``) and snake_case in Python. Models are frozen and reject
unknown keys; cross-field checks that need the catalogue or the plugin registries live in `fleet.spec.validate`.
The sections live by concern: the pool's keys in `fleet.spec.pool`, the gateway's in `fleet.spec.gateway`, the
cluster's (node groups, images, observability, model store, cost) in `fleet.spec.cluster`, the autoscaler's and
the control plane's in `fleet.spec.control`, tenants and aliases in `fleet.spec.clients`, the shared base in
`fleet.spec.base`; every model is importable from here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleet.spec.base import KEY_HASH, Name, PluginRef, Spec
from fleet.spec.clients import AliasName, AliasSpec, RolloutSpec, TenantSpec
from fleet.spec.cluster import (
    ClusterSpec,
    CostSpec,
    CpuNodeGroupSpec,
    GpuNodeGroupSpec,
    ImagesSpec,
    ModelStoreSpec,
    ObservabilitySpec,
)
from fleet.spec.control import AutoscalingSpec, ControlPlaneSpec
from fleet.spec.disagg import DisaggregationSpec, PrefillRoleSpec
from fleet.spec.gateway import (
    GatewaySpec,
    GatewayTlsSpec,
    GatewayTracingSpec,
    QueueSpec,
    QuotaRedisSpec,
    RetrySpec,
    RoutingSpec,
    TimeoutSpec,
)
from fleet.spec.pool import (
    DRAIN_MARGIN_S,
    AdapterSpec,
    DrainSpec,
    EngineSpec,
    ModelFactsSpec,
    PoolSpec,
    ReplicasSpec,
    RestartWindowSpec,
    SimSpec,
    SloSpec,
    WorkloadSpec,
)

__all__ = [
    "DRAIN_MARGIN_S",
    "KEY_HASH",
    "AdapterSpec",
    "AliasSpec",
    "AutoscalingSpec",
    "ClusterSpec",
    "ControlPlaneSpec",
    "CostSpec",
    "CpuNodeGroupSpec",
    "DisaggregationSpec",
    "DrainSpec",
    "EngineSpec",
    "FleetSpec",
    "GatewaySpec",
    "GatewayTlsSpec",
    "GatewayTracingSpec",
    "GpuNodeGroupSpec",
    "ImagesSpec",
    "ModelFactsSpec",
    "ModelStoreSpec",
    "ObservabilitySpec",
    "PluginRef",
    "PoolSpec",
    "PrefillRoleSpec",
    "QueueSpec",
    "QuotaRedisSpec",
    "ReplicasSpec",
    "RestartWindowSpec",
    "RetrySpec",
    "RolloutSpec",
    "RoutingSpec",
    "SimSpec",
    "SloSpec",
    "TenantSpec",
    "TimeoutSpec",
    "WorkloadSpec",
]


class FleetSpec(Spec):
    """The whole fleet as declared in ``stacks/Pulumi.<env>.yaml`` (keys ``llmfleet:<key>``)."""

    environment: Name
    """Environment name."""
    target: Literal["local", "kubernetes", "aws"]
    """Where the fleet runs: this machine, an existing Kubernetes cluster, or AWS (EKS)."""
    region: str = "us-east-1"
    """AWS region (also read from `aws:region`)."""
    availability_zones: list[str] = Field(min_length=1, max_length=6)
    """Zones the fleet spreads over."""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    cpu_node_group: CpuNodeGroupSpec = Field(default_factory=CpuNodeGroupSpec)
    gpu_node_groups: list[GpuNodeGroupSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(min_length=1)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    tenants: list[TenantSpec] = Field(min_length=1)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    control_plane: ControlPlaneSpec = Field(default_factory=ControlPlaneSpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    model_store: ModelStoreSpec = Field(default_factory=ModelStoreSpec)
    cost: CostSpec = Field(default_factory=CostSpec)
    aliases: dict[AliasName, AliasSpec] = Field(default_factory=dict)
    """Model names served by several pools by weight (canary rollouts), with a fallback pool."""

    @property
    def engine_pools(self) -> list[PoolSpec]:
        """Every pool whose replicas run engines: each of `pools`, then the prefill role pool of each disaggregated
        one (`PoolSpec.prefill_pool`). Agents, the control plane and gateways' endpoint sets work on these; models
        resolve to `pools` only."""
        derived = [p.prefill_pool() for p in self.pools]
        return list(self.pools) + [p for p in derived if p is not None]

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name``, a prefill role pool included; KeyError lists the pools that exist."""
        for pool in self.engine_pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r}; pools: {', '.join(p.name for p in self.engine_pools)}")

    def node_group(self, name: str) -> GpuNodeGroupSpec:
        for group in self.gpu_node_groups:
            if group.name == name:
                return group
        raise KeyError(f"no GPU node group {name!r}")

    def zones_of(self, group: GpuNodeGroupSpec) -> list[str]:
        return list(group.zones) if group.zones is not None else list(self.availability_zones)
