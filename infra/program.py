"""Program: build every component a FleetSpec asks for, on the target it names; return what to export.

``aws``: network, EKS, node groups, model store, IAM, then the Kubernetes part through a provider built from
the new cluster's kubeconfig. ``kubernetes``: only the Kubernetes part, on the cluster of the stack's
kubeconfig (a path) or context (a name). On both, what the fleet needs from the cluster is installed first and
waited for: the Prometheus Operator CRDs before the rules, the AWS Load Balancer Controller before every Service
and the metrics-server chart (aws: its webhook sees every Service created), the fleet namespace before what lives
in it (and, on aws, the dashboards' namespace before their ConfigMaps), the quota Redis and its Secret before the
gateway Deployment, metrics-server for the HPA. The first-up policies (`policies.first_up`) check that order.
``local`` has no cloud resources: `LocalTarget` says to use ``llmfleet up``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.capacity.paid import plan_groups
from fleet.protocol import contract
from fleet.spec.stack import FleetSpec
from infra.cluster import Cluster, ClusterArgs
from infra.config import engine_api_key
from infra.control_auth import TokenReviewAccess
from infra.control_plane_tier import ControlPlane, ControlPlaneArgs
from infra.dashboards.configmaps import DashboardConfigMaps, DashboardConfigMapsArgs
from infra.device_plugin import DevicePlugin, DevicePluginArgs
from infra.efa import efa_node_groups
from infra.efa_cloud import EfaDevicePlugin, EfaDevicePluginArgs
from infra.gateway_tier import Gateway, GatewayArgs
from infra.iam import autoscaler_policy, irsa_role
from infra.images import ImageRefs, ImageRepositories, ImageRepositoriesArgs, image_refs
from infra.k8s_base import FleetBase, FleetBaseArgs
from infra.lb_controller import LoadBalancerController, LoadBalancerControllerArgs
from infra.metrics_server import MetricsServer, MetricsServerArgs
from infra.network import Network, NetworkArgs
from infra.network_policies import NetworkPolicies
from infra.node_guard import NodeGuard
from infra.nodegroups import NodeGroups, NodeGroupsArgs
from infra.observability import SloRules, SloRulesArgs
from infra.pools import EnginePool, EnginePoolArgs
from infra.prometheus_crds import PrometheusCrds
from infra.quota_cache import QuotaCache, QuotaCacheArgs
from infra.quota_redis import QuotaRedis, QuotaRedisArgs, provisions_redis
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
    redis_auth_token: pulumi.Input[str] | None = None  # secret; needed when the program provisions the quota Redis
    engine_api_key: pulumi.Input[str] | None = None  # secret; None: read from config (`infra.config.engine_api_key`)


def monthly_cost(spec: FleetSpec) -> dict[str, float]:
    """What the GPU nodes cost per month at the pools' minimum and at peak: whole nodes per zone, pools sharing a
    node group counted once (`fleet.capacity.paid`)."""
    groups = plan_groups(spec)
    return {
        "min": round(sum(g.at_min.monthly_cost_usd for g in groups), 2),
        "peak": round(sum(g.at_peak.monthly_cost_usd for g in groups), 2),
    }


def _kubernetes_provider(spec: FleetSpec) -> k8s.Provider:
    ref = spec.cluster.kubeconfig
    if ref is None:
        return k8s.Provider("k8s")
    if "/" in ref or ref.startswith("~") or ref.endswith((".yaml", ".yml", "config")):
        return k8s.Provider("k8s", kubeconfig=os.path.expanduser(ref))
    return k8s.Provider("k8s", context=ref)


@dataclass
class _Cloud:
    """What the Kubernetes part takes from the cloud part (aws) or from the stack's cluster (kubernetes)."""

    provider: k8s.Provider
    engine_role_arn: pulumi.Input[str] | None = None
    gateway_role_arn: pulumi.Input[str] | None = None  # reads the pools' tokenizers from the model bucket
    autoscaler_role_arn: pulumi.Input[str] | None = None
    model_bucket: pulumi.Input[str] | None = None
    repositories: dict[str, pulumi.Input[str]] | None = None  # image -> the stack's ECR repository URL (aws)
    nodegroup_names: dict[tuple[str, str], pulumi.Input[str]] = field(default_factory=dict)
    redis_url: pulumi.Input[str] | None = None
    redis_server: list[pulumi.Resource] = field(default_factory=list)  # what the gateway waits for (ElastiCache)
    before_service: list[pulumi.Resource] = field(default_factory=list)  # what runs before any Service (aws)
    cpu_nodes: dict[str, str] = field(default_factory=dict)  # the node selector of the fleet's CPU pods


def build_fleet(inputs: FleetInputs) -> dict[str, Any]:
    """Create the stack's resources; return the stack outputs (Outputs or plain values)."""
    spec = inputs.spec
    if spec.target == "local":
        raise LocalTarget(spec.environment)
    tags = {"llmfleet.io/environment": spec.environment, "app.kubernetes.io/part-of": "llmfleet"}
    outputs: dict[str, Any] = {"monthlyCostUsd": monthly_cost(spec), "target": spec.target}
    api_key = inputs.engine_api_key if inputs.engine_api_key is not None else engine_api_key()
    redis_token = inputs.redis_auth_token
    if provisions_redis(spec) and redis_token is None:
        raise ValueError(f"the quota Redis needs its password: set config {spec.gateway.redis.auth_token_secret}")
    if spec.target == "aws":
        cloud = _aws(spec, inputs, tags, outputs)
    else:
        cloud = _kubernetes(spec, outputs)
    gateway = _fleet(spec, inputs, api_key, cloud)
    outputs["gatewayUrl"] = gateway.url
    outputs["gatewayLoadBalancer"] = gateway.load_balancer
    outputs["namespace"] = spec.cluster.namespace
    return outputs


def _kubernetes(spec: FleetSpec, outputs: dict[str, Any]) -> _Cloud:
    """The stack's own cluster (its kubeconfig or context): nothing to create outside it."""
    outputs["clusterName"] = spec.cluster.kubeconfig or "(current kubeconfig context)"
    outputs["nodeGroupsPerAz"] = {}
    outputs["imageRegistry"] = spec.images.registry
    return _Cloud(_kubernetes_provider(spec))


def _aws_cluster(spec: FleetSpec, tags: dict[str, str]) -> tuple[Network, Cluster]:
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
            admin_role_arns=list(spec.cluster.admin_role_arns),
            ci_role_arns=list(spec.cluster.ci_role_arns),
            log_retention_days=spec.cluster.log_retention_days,
            tags=tags,
        ),
    )
    return network, cluster


def _aws(spec: FleetSpec, inputs: FleetInputs, tags: dict[str, str], outputs: dict[str, Any]) -> _Cloud:
    """Network, EKS, node groups, model store, IAM, the quota cache, the LB controller and the image registry;
    the Kubernetes provider is built from the new cluster's kubeconfig."""
    network, cluster = _aws_cluster(spec, tags)
    nodes = _node_groups(spec, inputs, network, cluster, tags)
    store_args = ModelStoreArgs(
        spec.environment, spec.cluster.namespace, cluster.oidc_provider, tags, prefix=spec.model_store.prefix
    )
    store = ModelStore("store", store_args)
    cluster_name = contract.cluster_name(spec.environment)
    autoscaler = irsa_role(
        "autoscaler",
        cluster.oidc_provider,
        spec.cluster.namespace,
        contract.CONTROL_PLANE_NAME,
        pulumi.Output.all(*nodes.gpu_group_arns).apply(
            lambda arns: autoscaler_policy([str(a) for a in arns], cluster_name)
        ),
        cluster,
        tags,
    )
    provider = k8s.Provider(
        "k8s",
        kubeconfig=cluster.kubeconfig,
        enable_server_side_apply=True,
        opts=pulumi.ResourceOptions(depends_on=[nodes]),
    )
    cloud = _Cloud(
        provider,
        engine_role_arn=store.engine_role_arn,
        gateway_role_arn=store.gateway_role_arn,
        autoscaler_role_arn=autoscaler.arn,
        model_bucket=store.bucket_name,
        nodegroup_names=dict(nodes.gpu_group_names),
        cpu_nodes={contract.LABEL_NODE_ROLE: "cpu"},
    )
    cache = _quota_cache(spec, inputs, network, cluster, tags)
    if cache is not None:
        cloud.redis_url, cloud.redis_server = cache.url, [cache.group]
    cloud.before_service.append(_lb_controller(spec, network, cluster, cloud, tags).release)
    registry = ImageRepositories("images", ImageRepositoriesArgs(spec.environment, tags))
    cloud.repositories = dict(registry.urls)
    outputs["imageRegistry"] = registry.registry
    outputs["clusterName"] = cluster.name
    outputs["modelBucket"] = store.bucket_name
    groups_per_zone = nodes.gpu_groups.items()
    outputs["nodeGroupsPerAz"] = {zone: [g.node_group_name for g in groups] for zone, groups in groups_per_zone}
    outputs["kubeconfig"] = cluster.kubeconfig
    return cloud


def _node_groups(
    spec: FleetSpec, inputs: FleetInputs, network: Network, cluster: Cluster, tags: dict[str, str]
) -> NodeGroups:
    args = NodeGroupsArgs(
        spec=spec,
        cluster_name=cluster.name,
        private_subnet_ids=network.private_subnet_ids,
        capacity_reservations=inputs.capacity_reservations,
        tags=tags,
        vpc_id=network.vpc_id,
        cluster_security_group_id=cluster.security_group_id,
    )
    return NodeGroups("nodes", args, opts=pulumi.ResourceOptions(depends_on=[cluster.cni_addon]))


def _quota_cache(
    spec: FleetSpec, inputs: FleetInputs, network: Network, cluster: Cluster, tags: dict[str, str]
) -> QuotaCache | None:
    """The quota Redis on ElastiCache, when the program provisions it."""
    if not provisions_redis(spec) or inputs.redis_auth_token is None:
        return None
    return QuotaCache(
        "quota-cache",
        QuotaCacheArgs(
            environment=spec.environment,
            node_type=spec.gateway.redis.node_type,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            client_security_group_id=cluster.security_group_id,
            auth_token=inputs.redis_auth_token,
            auth_token_secret=spec.gateway.redis.auth_token_secret,
            tags=tags,
        ),
    )


def _lb_controller(
    spec: FleetSpec, network: Network, cluster: Cluster, cloud: _Cloud, tags: dict[str, str]
) -> LoadBalancerController:
    return LoadBalancerController(
        "lb-controller",
        LoadBalancerControllerArgs(
            cluster_name=cluster.name,
            region=spec.region,
            vpc_id=network.vpc_id,
            node_security_group_id=cluster.security_group_id,
            oidc_provider=cluster.oidc_provider,
            node_selector=cloud.cpu_nodes,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"kubernetes": cloud.provider}),
    )


def _cluster_addons(spec: FleetSpec, cloud: _Cloud, base: FleetBase, images: ImageRefs) -> list[pulumi.Resource]:
    """Network policies, the device plugins (aws: NVIDIA's, and EFA's for P/D pools), metrics-server and the
    Prometheus Operator CRDs; returns what the SLO rules wait for."""
    on_k8s = pulumi.ResourceOptions(providers={"kubernetes": cloud.provider})
    after_base = pulumi.ResourceOptions(providers={"kubernetes": cloud.provider}, depends_on=[base])
    in_cluster_redis = provisions_redis(spec) and spec.target == "kubernetes"
    NetworkPolicies("network-policies", spec, in_cluster_redis, opts=after_base)
    if spec.target == "aws":
        DevicePlugin("nvidia", DevicePluginArgs(images.device_plugin), opts=on_k8s)
    if spec.target == "aws" and efa_node_groups(spec):
        EfaDevicePlugin("efa", EfaDevicePluginArgs(), opts=on_k8s)  # P/D pools' KV cache over EFA (`infra.efa`)
    if spec.cluster.install_metrics_server:
        # The chart makes a Service: it waits for the LB controller's webhook like the program's own Services.
        after_controller = pulumi.ResourceOptions(
            providers={"kubernetes": cloud.provider}, depends_on=cloud.before_service
        )
        MetricsServer("metrics-server", MetricsServerArgs(cloud.cpu_nodes), opts=after_controller)
    before_rules: list[pulumi.Resource] = [base]
    if spec.observability.install_operator_crds:
        before_rules.append(PrometheusCrds("prometheus-crds", opts=on_k8s).release)
    return before_rules


def _fleet(spec: FleetSpec, inputs: FleetInputs, api_key: pulumi.Input[str], cloud: _Cloud) -> Gateway:
    """The Kubernetes part: the fleet's base, add-ons, quota Redis, pools, gateway, control plane, SLO rules and
    dashboards; returns the gateway."""
    images = image_refs(spec, cloud.repositories)
    on_k8s = pulumi.ResourceOptions(providers={"kubernetes": cloud.provider})
    base = FleetBase(
        "fleet", FleetBaseArgs(spec, inputs.tenant_key_hashes, api_key, cloud.engine_role_arn), opts=on_k8s
    )
    after_base = pulumi.ResourceOptions(providers={"kubernetes": cloud.provider}, depends_on=[base])
    before_rules = _cluster_addons(spec, cloud, base, images)
    before_gateway: list[pulumi.Resource] = [base]
    if provisions_redis(spec) and inputs.redis_auth_token is not None:
        redis = QuotaRedisArgs(spec, inputs.redis_auth_token, cloud.redis_url, after=[base])
        quota = QuotaRedis("quota-redis", redis, opts=on_k8s)
        before_gateway += [*quota.ready, *cloud.redis_server]
    for pool in spec.engine_pools:  # a P/D pool's prefill role pool (`<pool>-prefill`) is deployed like any pool
        EnginePool(
            f"pool-{pool.name}",
            EnginePoolArgs(spec, pool, images, cloud.model_bucket, api_key, service_after=cloud.before_service),
            opts=after_base,
        )
    gateway = Gateway(
        "gateway",
        GatewayArgs(
            spec,
            images,
            inputs.tenant_key_hashes,
            api_key,
            deployment_after=before_gateway,
            service_after=[base, *cloud.before_service],
            model_bucket=cloud.model_bucket,
            role_arn=cloud.gateway_role_arn,
        ),
        opts=after_base,
    )
    TokenReviewAccess("control-auth", spec, opts=after_base)
    if spec.target == "aws":
        # The control plane's ClusterRole may patch every node: this policy narrows it to cordoning GPU nodes.
        NodeGuard("node-guard", spec, opts=on_k8s)
    control = ControlPlaneArgs(
        spec, images, cloud.autoscaler_role_arn, cloud.nodegroup_names, service_after=cloud.before_service
    )
    ControlPlane("control-plane", control, opts=after_base)
    SloRules("slo", SloRulesArgs(spec, after=before_rules), opts=after_base)
    if spec.observability.grafana_dashboards:
        DashboardConfigMaps("dashboards", DashboardConfigMapsArgs(spec, after=[base]), opts=on_k8s)
    return gateway
