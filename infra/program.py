"""Program: build every component a FleetSpec asks for, on the target it names; return what to export.

``aws``: network, EKS, node groups, model store, IAM, then the Kubernetes part through a provider built from
the new cluster's kubeconfig. ``kubernetes``: only the Kubernetes part, on the cluster of the stack's
kubeconfig (a path) or context (a name). ``local`` has no cloud resources: `LocalTarget` says to use
``llmfleet up``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet import contract
from fleet.capacity import plan_pool
from fleet.spec import FleetSpec
from infra.cluster import Cluster, ClusterArgs
from infra.control_plane import ControlPlane, ControlPlaneArgs
from infra.device_plugin import DevicePlugin
from infra.gateway_tier import Gateway, GatewayArgs
from infra.iam import autoscaler_policy, irsa_role
from infra.k8s_base import FleetBase, FleetBaseArgs
from infra.network import Network, NetworkArgs
from infra.nodegroups import NodeGroups, NodeGroupsArgs
from infra.observability import SloRules, SloRulesArgs
from infra.pools import EnginePool, EnginePoolArgs
from infra.storage import ModelStore, ModelStoreArgs

__all__ = ["FleetInputs", "LocalTarget", "build_fleet", "monthly_cost"]


class LocalTarget(Exception):
    """The stack runs on one machine; `pulumi up` has nothing to create."""

    def __init__(self, environment: str) -> None:
        super().__init__(
            f"stack {environment!r} has target 'local': its processes run on this machine, not in a cloud. "
            f"Run it with `llmfleet up --stack {environment}` (or `make up`)."
        )


@dataclass(frozen=True)
class FleetInputs:
    """What the program needs beyond the spec: secrets and per-deployment facts from Pulumi config."""

    spec: FleetSpec
    tenant_key_hashes: pulumi.Input[str]
    capacity_reservations: dict[str, str] = field(default_factory=dict)


def monthly_cost(spec: FleetSpec) -> dict[str, float]:
    """The capacity plan's GPU cost per month, at the pools' minimum and at peak."""
    plans = [plan_pool(spec, pool) for pool in spec.pools]
    return {
        "min": round(sum(p.monthly_cost_min_usd for p in plans), 2),
        "peak": round(sum(p.monthly_cost_peak_usd for p in plans), 2),
    }


def _kubernetes_provider(spec: FleetSpec) -> k8s.Provider:
    ref = spec.cluster.kubeconfig
    if ref is None:
        return k8s.Provider("k8s")
    if "/" in ref or ref.startswith("~") or ref.endswith((".yaml", ".yml", "config")):
        return k8s.Provider("k8s", kubeconfig=os.path.expanduser(ref))
    return k8s.Provider("k8s", context=ref)


def build_fleet(inputs: FleetInputs) -> dict[str, Any]:
    """Create the stack's resources; return the stack outputs (Outputs or plain values)."""
    spec = inputs.spec
    if spec.target == "local":
        raise LocalTarget(spec.environment)
    tags = {"llmfleet.io/environment": spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
    outputs: dict[str, Any] = {"monthlyCostUsd": monthly_cost(spec), "target": spec.target}
    engine_role_arn: pulumi.Input[str] | None = None
    autoscaler_role_arn: pulumi.Input[str] | None = None
    model_bucket: pulumi.Input[str] | None = None
    if spec.target == "aws":
        cluster_name = contract.cluster_name(spec.environment)
        network = Network("network", NetworkArgs(cluster_name, list(spec.availability_zones), tags))
        cluster = Cluster(
            "cluster",
            ClusterArgs(
                cluster_name=cluster_name,
                kubernetes_version=spec.cluster.kubernetes_version,
                subnet_ids=list(network.private_subnet_ids.values()),
                region=spec.region,
                public_access_cidrs=list(spec.cluster.public_endpoint_cidrs),
                tags=tags,
            ),
        )
        nodes = NodeGroups(
            "nodes",
            NodeGroupsArgs(
                spec=spec,
                cluster_name=cluster.name,
                private_subnet_ids=network.private_subnet_ids,
                capacity_reservations=inputs.capacity_reservations,
                tags=tags,
            ),
        )
        store = ModelStore(
            "store",
            ModelStoreArgs(spec.environment, spec.cluster.namespace, cluster.oidc_provider, tags),
        )
        autoscaler = irsa_role(
            "autoscaler",
            cluster.oidc_provider,
            spec.cluster.namespace,
            contract.CONTROL_PLANE_NAME,
            pulumi.Output.all(*nodes.gpu_group_arns).apply(lambda arns: autoscaler_policy([str(a) for a in arns])),
            cluster,
            tags,
        )
        engine_role_arn, autoscaler_role_arn, model_bucket = store.engine_role_arn, autoscaler.arn, store.bucket_name
        provider = k8s.Provider(
            "k8s",
            kubeconfig=cluster.kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(depends_on=[nodes]),
        )
        outputs["clusterName"] = cluster.name
        outputs["modelBucket"] = store.bucket_name
        outputs["nodeGroupsPerAz"] = {
            zone: [g.node_group_name for g in groups] for zone, groups in nodes.gpu_groups.items()
        }
        outputs["kubeconfig"] = cluster.kubeconfig
    else:
        provider = _kubernetes_provider(spec)
        outputs["clusterName"] = spec.cluster.kubeconfig or "(current kubeconfig context)"
        outputs["nodeGroupsPerAz"] = {}

    on_k8s = pulumi.ResourceOptions(providers={"kubernetes": provider})
    base = FleetBase(
        "fleet",
        FleetBaseArgs(spec, inputs.tenant_key_hashes, engine_role_arn),
        opts=on_k8s,
    )
    after_base = pulumi.ResourceOptions(providers={"kubernetes": provider}, depends_on=[base])
    if spec.target == "aws":
        DevicePlugin("nvidia", opts=on_k8s)
    for pool in spec.pools:
        EnginePool(f"pool-{pool.name}", EnginePoolArgs(spec, pool, model_bucket), opts=after_base)
    gateway = Gateway("gateway", GatewayArgs(spec), opts=after_base)
    ControlPlane("control-plane", ControlPlaneArgs(spec, autoscaler_role_arn), opts=after_base)
    SloRules("slo", SloRulesArgs(spec), opts=after_base)
    outputs["gatewayUrl"] = gateway.url
    outputs["namespace"] = spec.cluster.namespace
    return outputs
