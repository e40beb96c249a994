"""EFA cloud: the node side of EFA for the GPU groups that run P/D pools (`infra.efa.efa_node_groups`).

Each fact from its source:

* **Interfaces.** A managed node group gets EFA interfaces from its launch template
  (awsdocs/amazon-eks-user-guide@43d79bdb:latest/ug/ml/device-management-efa.adoc, "EKS managed node groups and
  self-managed nodes"): one per network card, card 0 at device index 0, each other card at device index 1, all of
  type ``efa`` (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html; eksctl builds the same,
  eksctl-io/eksctl@99984adb:pkg/cfn/builder/network_interfaces.go). No subnet in the template: EKS rejects one (same
  EKS page).
* **Security groups.** "The EFA must be a member of a security group that allows all inbound and outbound traffic to
  and from the security group itself" (awsdocs/amazon-ec2-user-guide@0147f878:doc_source/efa.md). `EfaSecurityGroup`
  is such a group: all protocols in from itself and out to itself, as eksctl's ``EFASG`` with its ``EFAIngressSelf``
  and ``EFAEgressSelf`` (eksctl-io/eksctl@99984adb:pkg/cfn/builder/vpc.go). A group of its own, not rules on the
  EKS-made cluster security group: that group already has an all-traffic rule from itself
  (awsdocs/amazon-eks-user-guide@2ef9e386:latest/ug/networking/sec-group-reqs.adoc), which a second identical rule
  would duplicate. Interfaces that name security groups lose the cluster security group EKS adds by default
  (awsdocs/amazon-eks-user-guide@1fe584bb:latest/ug/nodes/launch-templates.adoc, "Using custom security groups"), so
  each interface names both. No ``kubernetes.io/cluster`` tag on it: the AWS Load Balancer Controller expects one
  group so tagged per node (eksctl's comment on ``EFASG``).
* **Placement.** AWS recommends launching EFA instances into a cluster placement group, "a low-latency group in a
  single Availability Zone"; it is not required (awsdocs/amazon-ec2-user-guide@0147f878:doc_source/efa-start.md,
  Step 8). One ``cluster`` group per node group and zone (each of our GPU node groups is zonal), named in its launch
  template, as eksctl does for an EFA managed node group (eksctl-io/eksctl@99984adb:
  pkg/cfn/builder/managed_launch_template.go). A capacity-block group gets none: its reservation fixes where its
  instances run (eksctl skips the group when a reservation is set, citing
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cr-cpg.html).
* **Device plugin.** The EKS AL2023 NVIDIA AMI carries the EFA host software but not the device plugin, which must be
  installed (device-management-efa.adoc above): AWS's ``aws-efa-k8s-device-plugin`` chart from eks-charts
  (https://aws.github.io/eks-charts), pinned to `EFA_CHART_VERSION`. Its DaemonSet tolerates only
  ``CriticalAddonsOnly`` plus the ``tolerations`` value, default ``[]``, and takes a ``nodeSelector`` value, default
  ``{}`` (aws/eks-charts@5239609:stable/aws-efa-k8s-device-plugin/values.yaml and templates/daemonset.yaml): the
  release tolerates the GPU taint (`infra.nodegroups`) and selects the EFA nodes (`infra.efa.EFA_NODE_LABEL`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from infra.efa import EFA_NODE_LABEL

__all__ = [
    "EFA_CHART",
    "EFA_CHART_REPO",
    "EFA_CHART_VERSION",
    "EfaDevicePlugin",
    "EfaDevicePluginArgs",
    "EfaSecurityGroup",
    "efa_network_interfaces",
    "efa_plugin_values",
    "placement_group_name",
]

EFA_CHART = "aws-efa-k8s-device-plugin"
EFA_CHART_REPO = "https://aws.github.io/eks-charts"
# aws/eks-charts@5239609:stable/aws-efa-k8s-device-plugin/Chart.yaml: version v0.5.30, appVersion v0.5.20.
EFA_CHART_VERSION = "v0.5.30"


def efa_network_interfaces(
    count: int, security_groups: Sequence[pulumi.Input[str]]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict]:
    """``count`` EFA interfaces, one per network card: card 0 at device index 0, the others at device index 1; each
    in ``security_groups`` (the cluster security group and the EFA group)."""
    return [
        {
            "network_card_index": card,
            "device_index": 0 if card == 0 else 1,
            "interface_type": "efa",
            "security_groups": list(security_groups),
            "delete_on_termination": "true",
        }
        for card in range(count)
    ]


def placement_group_name(cluster_name: str, group: str, zone: str) -> str:
    """The cluster placement group of one GPU node group in one zone (unique per account and region)."""
    return f"{cluster_name}-{group}-{zone}"


class EfaSecurityGroup(pulumi.ComponentResource):
    """A security group that lets all traffic in from and out to itself (see the module docstring)."""

    id: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        vpc_id: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("llmfleet:infra:EfaSecurityGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc_id,
            description="EFA: all traffic within the group (OS-bypass)",
            tags={**tags, "Name": f"{name}-efa"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-in-self",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="EFA: all traffic from the group itself",
            tags=tags,
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-out-self",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="EFA: all traffic to the group itself",
            tags=tags,
            opts=child,
        )
        self.id = group.id
        self.register_outputs({"id": group.id})


def efa_plugin_values(node_selector: dict[str, str]) -> dict[str, Any]:
    """The chart's values: tolerate the GPU node groups' taint, run on ``node_selector``'s nodes only."""
    return {
        "tolerations": [{"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": dict(node_selector),
    }


@dataclass(frozen=True)
class EfaDevicePluginArgs:
    # The EFA GPU nodes: `infra.nodegroups.gpu_node_labels` puts both labels on them.
    node_selector: dict[str, str] = field(
        default_factory=lambda: {contract.LABEL_NODE_ROLE: "gpu", EFA_NODE_LABEL: "true"}
    )


class EfaDevicePlugin(pulumi.ComponentResource):
    """The ``aws-efa-k8s-device-plugin`` Helm release in ``kube-system``: advertises ``vpc.amazonaws.com/efa``."""

    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: EfaDevicePluginArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:EfaDevicePlugin", name, None, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            k8s.helm.v3.ReleaseArgs(
                name=EFA_CHART,
                chart=EFA_CHART,
                version=EFA_CHART_VERSION,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=EFA_CHART_REPO),
                namespace="kube-system",
                values=efa_plugin_values(args.node_selector),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"release": self.release.name})
