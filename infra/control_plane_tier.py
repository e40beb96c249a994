"""Control plane: one ``llmfleet control-plane`` pod with just the Kubernetes rights its actuator needs.

Its Role may read and scale only the pools' Deployments (by name), read pods and patch them (the
``controller.kubernetes.io/pod-deletion-cost`` annotation picks which replica a scale-down removes), and
keep restart-window leases as Lease objects. On AWS its ServiceAccount assumes an IRSA role that may grow only
the fleet's own GPU node groups and terminate only the cluster's node instances, a ClusterRole lets it read and
cordon nodes (the only cluster-wide right: a node emptied by a drain is cordoned before it is terminated), and
its arguments name each GPU node group (``--nodegroup GROUP:ZONE=NAME``). ``Recreate``: never two control
planes deciding at once. Its pod template carries the sha256 of the rendered stack file it reads at start, so a
stack edit rolls it; its Service waits for the AWS Load Balancer Controller, whose webhook sees every Service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.protocol.marks import ANN_CHECKSUM_STACK
from fleet.spec.stack import FleetSpec
from infra.control_auth import auth_args, token_env, token_mount, token_volume
from infra.images import ImageRefs
from infra.k8s_base import (
    container_security_context,
    http_probe,
    pod_security_context,
    render_stack_file,
    sha256_text,
    spec_volumes,
)
from infra.k8s_shapes import shaped

__all__ = ["ControlPlane", "ControlPlaneArgs", "control_plane_pod_spec", "control_plane_rules", "nodegroup_args"]


def control_plane_rules(spec: FleetSpec) -> list[k8s.rbac.v1.PolicyRuleArgsDict]:
    """Namespaced RBAC rules: scale own pool Deployments, patch pods, use leases."""
    deployments = [contract.pool_deployment_name(p.name) for p in spec.engine_pools]  # prefill role pools too
    return [
        {"api_groups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
        {
            "api_groups": ["apps"],
            "resources": ["deployments/scale"],
            "resource_names": deployments,
            "verbs": ["get", "update", "patch"],
        },
        {"api_groups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"api_groups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        # Restart leases outlive the control plane as Lease objects (control_plane/leases/stores.py): these verbs only.
        {
            "api_groups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["list", "create", "update", "delete"],
        },
    ]


def nodegroup_args(nodegroups: Mapping[tuple[str, str], pulumi.Input[str]]) -> list[pulumi.Input[str]]:
    """``--nodegroup GROUP:ZONE=NAME`` for each GPU node group, sorted by group and zone."""
    out: list[pulumi.Input[str]] = []
    for (group, zone), name in sorted(nodegroups.items(), key=lambda item: item[0]):
        out += ["--nodegroup", pulumi.Output.concat(f"{group}:{zone}=", name)]
    return out


@dataclass(frozen=True)
class ControlPlaneArgs:
    spec: FleetSpec
    images: ImageRefs
    role_arn: pulumi.Input[str] | None = None  # IRSA role resizing the GPU node groups (aws target)
    # (GPU group, zone) -> EKS node group name: the aws actuator's ``--nodegroup`` flags
    nodegroups: Mapping[tuple[str, str], pulumi.Input[str]] = field(default_factory=dict)
    service_after: Sequence[pulumi.Resource] = field(default_factory=list)  # the LB controller (its webhook)


def control_plane_pod_spec(
    spec: FleetSpec, images: ImageRefs, nodegroups: Mapping[tuple[str, str], pulumi.Input[str]]
) -> dict[str, Any]:
    """The control plane's pod spec (snake_case keys, as pulumi_kubernetes inputs): a read-only root file system,
    /tmp its one writable place, the stack file and tenant key hashes mounted, its service-account token."""
    port = spec.control_plane.port
    volumes, mounts = spec_volumes(spec)
    volumes = [*volumes, {"name": "tmp", "empty_dir": {"size_limit": "256Mi"}}]
    mounts = [*mounts, {"name": "tmp", "mount_path": "/tmp"}]
    pod: dict[str, Any] = {
        "service_account_name": contract.CONTROL_PLANE_NAME,
        # Its actuator, leases and TokenReview are Kubernetes API calls: it keeps its account's token.
        "automount_service_account_token": True,
        "security_context": pod_security_context(),
        "containers": [
            {
                "name": "control-plane",
                "image": images.runtime,
                "image_pull_policy": spec.images.pull_policy,
                "command": ["llmfleet"],
                "args": [
                    "control-plane",
                    "--stack",
                    contract.stack_file_path(spec.environment),
                    "--port",
                    str(port),
                    "--host",
                    "0.0.0.0",
                    *auth_args(),
                    *nodegroup_args(nodegroups),
                ],
                "ports": [{"name": "http", "container_port": port}],
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "readiness_probe": http_probe("/healthz", port, 5, 2),
                "liveness_probe": http_probe("/healthz", port, 10, 3),
                "volume_mounts": [*mounts, token_mount()],
                "env": token_env(),
                "security_context": container_security_context(read_only_root=True),
            }
        ],
        "volumes": [*volumes, token_volume()],
    }
    if spec.target == "aws":
        pod["node_selector"] = {contract.LABEL_NODE_ROLE: "cpu"}
    return pod


def _labels(spec: FleetSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llmfleet",
        contract.LABEL_COMPONENT: contract.COMPONENT_CONTROL_PLANE,
        contract.LABEL_ENVIRONMENT: spec.environment,
    }


class ControlPlane(pulumi.ComponentResource):
    """ServiceAccount, Role, RoleBinding, Deployment and ClusterIP Service of the control plane."""

    def __init__(self, name: str, args: ControlPlaneArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:ControlPlane", name, None, opts)
        spec = args.spec
        labels = _labels(spec)
        meta: k8s.meta.v1.ObjectMetaArgsDict = {
            "namespace": spec.cluster.namespace,
            "labels": labels,
            "name": contract.CONTROL_PLANE_NAME,
        }
        child = pulumi.ResourceOptions(parent=self)
        self._access(name, spec, meta, args.role_arn)
        actuator = spec.autoscaling.actuator + (" (dry run)" if spec.autoscaling.dry_run else "")
        deployment = {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"match_labels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {ANN_CHECKSUM_STACK: sha256_text(render_stack_file(spec))},
                },
                "spec": control_plane_pod_spec(spec, args.images, args.nodegroups),
            },
        }
        k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata={**meta, "annotations": {contract.ANN_ACTUATOR: actuator}},
            spec=shaped(deployment, k8s.apps.v1.DeploymentSpecArgsDict),
            opts=child,
        )
        service = {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": spec.control_plane.port, "target_port": "http"}],
        }
        k8s.core.v1.Service(
            f"{name}-service",
            metadata=meta,
            spec=shaped(service, k8s.core.v1.ServiceSpecArgsDict),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.service_after)),
        )
        self.register_outputs({})

    def _access(
        self, name: str, spec: FleetSpec, meta: k8s.meta.v1.ObjectMetaArgsDict, role_arn: pulumi.Input[str] | None
    ) -> None:
        """Its ServiceAccount (the IRSA role's annotation on aws), Role and RoleBinding; on aws the nodes'
        ClusterRole and its binding."""
        child = pulumi.ResourceOptions(parent=self)
        annotations: dict[str, pulumi.Input[str]] = {} if role_arn is None else {"eks.amazonaws.com/role-arn": role_arn}
        account: k8s.rbac.v1.SubjectArgsDict = {
            "kind": "ServiceAccount",
            "name": contract.CONTROL_PLANE_NAME,
            "namespace": spec.cluster.namespace,
        }
        k8s.core.v1.ServiceAccount(f"{name}-sa", metadata={**meta, "annotations": annotations}, opts=child)
        k8s.rbac.v1.Role(f"{name}-role", metadata=meta, rules=control_plane_rules(spec), opts=child)
        k8s.rbac.v1.RoleBinding(
            f"{name}-binding",
            metadata=meta,
            role_ref={"api_group": "rbac.authorization.k8s.io", "kind": "Role", "name": contract.CONTROL_PLANE_NAME},
            subjects=[account],
            opts=child,
        )
        if spec.target != "aws":
            return
        # The aws actuator cordons the GPU nodes a drain emptied before terminating them: nodes only.
        nodes_role = f"{contract.CONTROL_PLANE_NAME}-{spec.environment}-nodes"
        cluster_meta: k8s.meta.v1.ObjectMetaArgsDict = {"name": nodes_role, "labels": _labels(spec)}
        k8s.rbac.v1.ClusterRole(
            f"{name}-nodes",
            metadata=cluster_meta,
            rules=[{"api_groups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}],
            opts=child,
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-nodes-binding",
            metadata=cluster_meta,
            role_ref={"api_group": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": nodes_role},
            subjects=[account],
            opts=child,
        )
