"""Builders of resources as CrossGuard sees them (camelCase props), valid unless told otherwise."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleet.protocol import contract
from fleet.protocol.marks import ANN_FIRST_READY, ANN_PULUMI_TIMEOUT

ECR_REPOSITORY_URL = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llmfleet-prod/runtime"
DIGEST_IMAGE = f"{ECR_REPOSITORY_URL}@sha256:" + "0" * 64

ENGINE_LABELS = {
    contract.LABEL_COMPONENT: contract.COMPONENT_ENGINE,
    contract.LABEL_POOL: "qwen-7b",
    contract.LABEL_ENVIRONMENT: "prod",
}


@dataclass(frozen=True)
class Res:
    type: str
    props: dict[str, Any]
    name: str = "r"
    urn: str = field(default="")
    dependencies: tuple[str, ...] = ()  # URNs it waits for
    parent: str | None = None

    def __post_init__(self) -> None:
        if not self.urn:
            object.__setattr__(self, "urn", f"urn:pulumi:test::llmfleet::{self.type}::{self.name}")


def engine(env: str = "prod", ann: dict[str, str] | None = None, **changes: Any) -> Res:
    """A valid engine Deployment; ``ann`` overrides annotations; ``changes`` maps dotted paths
    (``pod.terminationGracePeriodSeconds``) to values; a value of ``None`` deletes the key."""
    labels = {**ENGINE_LABELS, contract.LABEL_ENVIRONMENT: env}
    probe = {"httpGet": {"path": "/healthz", "port": 8000}}
    props: dict[str, Any] = {
        "metadata": {
            "name": "llmfleet-qwen-7b",
            "namespace": "llmfleet",
            "labels": labels,
            "annotations": {
                contract.ANN_ENGINE_KIND: "vllm",
                contract.ANN_TENSOR_PARALLEL: "2",
                contract.ANN_GPU_MEMORY_UTILIZATION: "0.9",
                contract.ANN_SHUTDOWN_TIMEOUT: "105",
                contract.ANN_DRAIN_PROPAGATION: "10",
                contract.ANN_MIN_REPLICAS: "3",
                contract.ANN_CAPACITY_BUFFER: "0.3",
                ANN_FIRST_READY: "1950",
                ANN_PULUMI_TIMEOUT: "2250",
            },
        },
        "spec": {
            "replicas": 3.0,
            "progressDeadlineSeconds": 1950.0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001.0, "runAsGroup": 10001.0},
                    "terminationGracePeriodSeconds": 120.0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": contract.ZONE_TOPOLOGY_KEY,
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "agent",
                            "image": DIGEST_IMAGE,
                            "resources": {
                                "limits": {contract.GPU_RESOURCE: "2"},
                                "requests": {contract.GPU_RESOURCE: "2"},
                            },
                            "startupProbe": probe,
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8000}},
                            "livenessProbe": probe,
                            "lifecycle": {
                                "preStop": {"httpGet": {"path": contract.AGENT_PRESTOP_PATH, "port": "agent"}}
                            },
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        }
                    ],
                },
            },
        },
    }
    shortcuts = {
        "pod": "spec.template.spec",
        "container": "spec.template.spec.containers.0",
        "ann": "metadata.annotations",
    }
    props["metadata"]["annotations"].update(ann or {})
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        full = f"{shortcuts.get(head, head)}.{rest}" if rest else shortcuts.get(head, head)
        _set(props, full.split("."), value)
    return Res(type="kubernetes:apps/v1:Deployment", props=props, name="pool-qwen-7b-deployment")


def waiting_for(resource: Res, *others: Res) -> Res:
    """``resource``, waiting for ``others`` (its dependencies)."""
    return dataclasses.replace(resource, dependencies=(*resource.dependencies, *(o.urn for o in others)))


def namespace(name: str = "llmfleet") -> Res:
    return Res(type="kubernetes:core/v1:Namespace", props={"metadata": {"name": name}}, name=f"ns-{name}")


def config_map(name: str, namespace_name: str, annotations: dict[str, str] | None = None) -> Res:
    metadata = {"name": name, "namespace": namespace_name, "annotations": dict(annotations or {})}
    return Res(type="kubernetes:core/v1:ConfigMap", props={"metadata": metadata, "data": {}}, name=name)


def lb_controller(failure_policy: str | None = None) -> Res:
    """The AWS Load Balancer Controller's release; its Service webhook fails closed unless told ``Ignore``."""
    values: dict[str, Any] = {"clusterName": "llmfleet-prod"}
    if failure_policy is not None:
        values["serviceMutatorWebhookConfig"] = {"failurePolicy": failure_policy}
    release = helm_release("aws-load-balancer-controller")
    return dataclasses.replace(release, props={**release.props, "values": values})


def custom_resource(kind: str = "Widget", group: str = "example.com") -> Res:
    return Res(type=f"kubernetes:{group}/v1:{kind}", props={"metadata": {"name": kind.lower()}}, name=kind.lower())


GATEWAY_LABELS = {contract.LABEL_COMPONENT: contract.COMPONENT_GATEWAY}


def gateway_service(
    request_timeout: int = 330, tls: bool = True, idle: int | None = None, delay: int | None = 120
) -> Res:
    """The gateway's NLB Service: a TLS listener on 443 (``tls``) or TCP on 80 with ``idle`` as its idle timeout
    attribute, the request timeout annotation and the target group's deregistration ``delay``."""
    lb = "service.beta.kubernetes.io/aws-load-balancer"
    annotations = {f"{lb}-type": "external", contract.ANN_REQUEST_TIMEOUT: str(request_timeout)}
    port = 443 if tls else 80
    if tls:
        annotations |= {
            f"{lb}-ssl-cert": "arn:aws:acm:us-east-1:123456789012:certificate/abc",
            f"{lb}-ssl-ports": "443",
        }
    if idle is not None:
        annotations[f"{lb}-listener-attributes.TCP-{port}"] = f"tcp.idle_timeout.seconds={idle}"
    if delay is not None:
        annotations[f"{lb}-target-group-attributes"] = f"deregistration_delay.timeout_seconds={delay}"
    metadata = {"name": contract.GATEWAY_NAME, "namespace": "llmfleet", "labels": GATEWAY_LABELS}
    return Res(
        type="kubernetes:core/v1:Service",
        props={
            "metadata": {**metadata, "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": GATEWAY_LABELS, "ports": [{"port": port}]},
        },
        name=f"gateway-service-{port}",
    )


def gateway_deployment(pre_stop: int = 0, grace: int = 725, propagation: int = 120) -> Res:
    """The gateway's Deployment: a preStop sleep (none: 0), its ``--drain-propagation`` and a termination grace."""
    container: dict[str, Any] = {"name": "gateway", "args": ["gateway", "--drain-propagation", str(propagation)]}
    if pre_stop:
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": float(pre_stop)}}}
    props = {
        "metadata": {"name": contract.GATEWAY_NAME, "namespace": "llmfleet", "labels": GATEWAY_LABELS},
        "spec": {
            "template": {
                "metadata": {"labels": GATEWAY_LABELS},
                "spec": {"terminationGracePeriodSeconds": float(grace), "containers": [container]},
            }
        },
    }
    return Res(type="kubernetes:apps/v1:Deployment", props=props, name="gateway-deployment")


def _set(target: Any, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
    last = keys[-1]
    if value is None:
        target.pop(last, None)
    else:
        target[last] = value


def pdb(labels: dict[str, str] | None = None, namespace: str = "llmfleet") -> Res:
    return Res(
        type="kubernetes:policy/v1:PodDisruptionBudget",
        props={
            "metadata": {"name": "llmfleet-qwen-7b", "namespace": namespace},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(labels or ENGINE_LABELS)}},
        },
        name="pool-qwen-7b-pdb",
    )


def service(kind: str = "ClusterIP", component: str = "engine", annotations: dict[str, str] | None = None) -> Res:
    return Res(
        type="kubernetes:core/v1:Service",
        props={
            "metadata": {
                "name": f"svc-{component}",
                "labels": {contract.LABEL_COMPONENT: component},
                "annotations": dict(annotations or {}),
            },
            "spec": {"type": kind, "ports": [{"port": 80}]},
        },
        name=f"{component}-service",
    )


def gpu_group(zone: str, env: str = "prod", max_size: int = 2, instance: str = "p4de.24xlarge", **extra: Any) -> Res:
    props: dict[str, Any] = {
        "amiType": "AL2023_x86_64_NVIDIA",
        "instanceTypes": [instance],
        "scalingConfig": {"minSize": 1.0, "maxSize": float(max_size), "desiredSize": 1.0},
        "launchTemplate": {"id": "lt-1", "version": "1"},
        "tags": {contract.TAG_ENVIRONMENT: env, contract.TAG_GPU_GROUP: "a100", contract.TAG_ZONE: zone},
    }
    props.update(extra)
    return Res(type="aws:eks/nodeGroup:NodeGroup", props=props, name=f"nodes-a100-{zone}")


def capacity_block_group(zone: str, env: str = "prod", max_size: int = 2) -> Res:
    """A capacity-block GPU group: no instance types of its own, its launch template names the instance type."""
    group = gpu_group(zone, env, max_size, capacityType="CAPACITY_BLOCK")
    del group.props["instanceTypes"]
    return group


def capacity_block_template(zone: str, env: str = "prod", instance: str = "p4de.24xlarge") -> Res:
    tags = {contract.TAG_ENVIRONMENT: env, contract.TAG_GPU_GROUP: "a100", contract.TAG_ZONE: zone}
    template = launch_template(instance_type=instance)
    props = {**template.props, "tags": tags, "instanceMarketOptions": {"marketType": "capacity-block"}}
    return Res(type=template.type, props=props, name=f"nodes-a100-{zone}")


def spec_configmap(
    env: str = "prod", cost: dict[str, float] | None = None, document: dict[str, Any] | None = None
) -> Res:
    """The ``llmfleet-spec`` ConfigMap with the stack file's ``llmfleet:cost`` block (prod's by default), or with
    a whole stack ``document`` (`tests.support.stacks.stack_document`)."""
    block = {"gpuHourUsd": 2.5, "monthlyCeilingUsd": 250_000} if cost is None else cost
    document = document or {"config": {"llmfleet:environment": env, "llmfleet:cost": block}}
    props = {
        "metadata": {
            "name": contract.SPEC_CONFIGMAP,
            "namespace": "llmfleet",
            "labels": {contract.LABEL_ENVIRONMENT: env},
        },
        "data": {f"Pulumi.{env}.yaml": yaml.safe_dump(document)},
    }
    return Res(type="kubernetes:core/v1:ConfigMap", props=props, name="fleet-spec")


def launch_template(encrypted: Any = "true", instance_type: str | None = None, hop_limit: float = 1.0) -> Res:
    props: dict[str, Any] = {
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": 500, "encrypted": encrypted}}],
        "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": hop_limit, "httpEndpoint": "enabled"},
    }
    if instance_type is not None:
        props["instanceType"] = instance_type
    return Res(type="aws:ec2/launchTemplate:LaunchTemplate", props=props, name="lt")


def bucket(name: str = "models-1") -> Res:
    return Res(type="aws:s3/bucket:Bucket", props={"bucket": name, "arn": f"arn:aws:s3:::{name}"}, name="models")


def sse(bucket_name: str = "models-1") -> Res:
    return Res(
        type="aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        props={"bucket": bucket_name, "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]},
        name="models-sse",
    )


def eks_cluster(encrypted: bool = True, public_cidrs: list[str] | None = None) -> Res:
    """An EKS cluster; ``public_cidrs`` opens its public endpoint to them (None: private endpoint only)."""
    vpc: dict[str, Any] = {"endpointPrivateAccess": True, "endpointPublicAccess": public_cidrs is not None}
    if public_cidrs:
        vpc["publicAccessCidrs"] = public_cidrs
    props: dict[str, Any] = {"version": "1.33", "vpcConfig": vpc}
    if encrypted:
        props["encryptionConfig"] = {"provider": {"keyArn": "arn:aws:kms:k"}, "resources": ["secrets"]}
    return Res(type="aws:eks/cluster:Cluster", props=props, name="cluster-eks")


def ecr_repository(url: str = ECR_REPOSITORY_URL) -> Res:
    return Res(type="aws:ecr/repository:Repository", props={"repositoryUrl": url}, name="images-runtime")


def clone(resource: Res) -> Res:
    return Res(resource.type, copy.deepcopy(resource.props), resource.name, resource.urn)


def control_plane(actuator: str = "aws", nodegroups: tuple[str, ...] = ()) -> Res:
    """The control plane's Deployment: its actuator annotation and ``--nodegroup`` arguments."""
    args = ["control-plane", "--stack", "/etc/llmfleet/stacks/Pulumi.prod.yaml"]
    for name in nodegroups:
        args += ["--nodegroup", f"a100:{name.rsplit('-', 1)[0]}={name}"]
    container = {"name": "control-plane", "image": DIGEST_IMAGE, "args": args}
    props = {
        "metadata": {
            "name": contract.CONTROL_PLANE_NAME,
            "labels": {contract.LABEL_COMPONENT: contract.COMPONENT_CONTROL_PLANE},
            "annotations": {contract.ANN_ACTUATOR: actuator},
        },
        "spec": {"template": {"spec": {"serviceAccountName": contract.CONTROL_PLANE_NAME, "containers": [container]}}},
    }
    return Res(type="kubernetes:apps/v1:Deployment", props=props, name="control-plane")


def service_account(name: str, automount: bool | None = None, namespace: str = "llmfleet") -> Res:
    """A ServiceAccount; ``automount`` its automountServiceAccountToken (unset: None)."""
    props: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace}}
    if automount is not None:
        props["automountServiceAccountToken"] = automount
    return Res(type="kubernetes:core/v1:ServiceAccount", props=props, name=f"{name}-sa")


def cluster_role_binding(account: str, namespace: str = "default") -> Res:
    """A ClusterRoleBinding granting a ClusterRole to the ServiceAccount ``account`` of ``namespace``."""
    props = {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    return Res(
        type="kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", props=props, name=f"{account}-binding"
    )


def role_policy(resize_arns: tuple[str, ...]) -> Res:
    statement = {"Effect": "Allow", "Action": ["eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"]}
    policy = {"Version": "2012-10-17", "Statement": [{**statement, "Resource": list(resize_arns)}]}
    return Res(type="aws:iam/rolePolicy:RolePolicy", props={"policy": json.dumps(policy)}, name="autoscaler")


def scalable_gpu_group(zone: str, min_size: int = 0) -> Res:
    """A GPU node group with its name and ARN, as the program's outputs give them."""
    return gpu_group(
        zone,
        nodeGroupName=f"gpu-{zone}",
        arn=f"arn:aws:eks:us-east-1:123456789012:nodegroup/llmfleet-prod/gpu-{zone}/1",
        scalingConfig={"minSize": float(min_size), "maxSize": 2.0, "desiredSize": float(min_size)},
    )


def helm_release(chart: str) -> Res:
    return Res(
        type="kubernetes:helm.sh/v3:Release",
        props={"chart": chart, "name": chart, "namespace": "kube-system"},
        name=f"{chart}-release",
    )


def prometheus_rule(kind: str = "PrometheusRule", operator: str = "installed") -> Res:
    """A PrometheusRule or PodMonitor, annotated with where the operator's CRDs come from."""
    metadata = {"name": f"llmfleet-{kind.lower()}", "annotations": {contract.ANN_PROMETHEUS_OPERATOR: operator}}
    return Res(
        type=f"kubernetes:monitoring.coreos.com/v1:{kind}",
        props={"metadata": metadata, "spec": {}},
        name=f"slo-{kind.lower()}",
    )


def gateway_hpa() -> Res:
    metric = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}
    return Res(
        type="kubernetes:autoscaling/v2:HorizontalPodAutoscaler",
        props={"metadata": {"name": contract.GATEWAY_NAME}, "spec": {"metrics": [metric]}},
        name="gateway-hpa",
    )


def nlb_service() -> Res:
    """The gateway's Service, handed to the AWS Load Balancer Controller."""
    return service("LoadBalancer", "gateway", {"service.beta.kubernetes.io/aws-load-balancer-type": "external"})


def quota_gateway(url_from: str = "secret") -> Res:
    """The gateway Deployment counting quotas in Redis, its URL from the stack (``stack``) or a Secret."""
    annotations = {contract.ANN_QUOTA_BACKEND: "redis", contract.ANN_REDIS_URL_FROM: url_from}
    props = {
        "metadata": {
            "name": contract.GATEWAY_NAME,
            "namespace": "llmfleet",
            "labels": {contract.LABEL_COMPONENT: contract.COMPONENT_GATEWAY},
            "annotations": annotations,
        },
        "spec": {"template": {"spec": {"containers": [{"name": "gateway", "image": DIGEST_IMAGE}]}}},
    }
    return Res(type="kubernetes:apps/v1:Deployment", props=props, name="gateway-deployment")


def quota_redis_secret() -> Res:
    return Res(
        type="kubernetes:core/v1:Secret",
        props={"metadata": {"name": contract.QUOTA_REDIS_NAME, "namespace": "llmfleet"}},
        name="quota-redis-secret",
    )


def elasticache_redis() -> Res:
    props = {"engine": "redis", "transitEncryptionEnabled": True, "primaryEndpointAddress": "master.r.cache.aws"}
    return Res(type="aws:elasticache/replicationGroup:ReplicationGroup", props=props, name="quota-cache-redis")


def network_policy(
    name: str, selector: dict[str, str] | None = None, ingress: list[dict[str, Any]] | None = None
) -> Res:
    """A NetworkPolicy in ``llmfleet`` selecting pods with ``selector`` (all pods when None) for ingress."""
    spec: dict[str, Any] = {"podSelector": {"matchLabels": selector} if selector else {}, "policyTypes": ["Ingress"]}
    if ingress is not None:
        spec["ingress"] = ingress
    return Res(
        type="kubernetes:networking.k8s.io/v1:NetworkPolicy",
        props={"metadata": {"name": name, "namespace": "llmfleet"}, "spec": spec},
        name=name,
    )


def _component(name: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {contract.LABEL_COMPONENT: name}}}


def engine_network_policies(extra_peer: dict[str, Any] | None = None) -> list[Res]:
    """Default deny plus engine ingress from gateways, the control plane and the ``monitoring`` namespace."""
    peers = [
        _component(contract.COMPONENT_GATEWAY),
        _component(contract.COMPONENT_CONTROL_PLANE),
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]
    if extra_peer is not None:
        peers.append(extra_peer)
    engines = {contract.LABEL_COMPONENT: contract.COMPONENT_ENGINE}
    return [
        network_policy("default-deny"),
        network_policy("engine-ingress", engines, [{"from": peers, "ports": [{"port": 8000}]}]),
    ]
