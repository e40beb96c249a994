"""Node groups: a CPU group across zones, and one GPU managed node group per zone per GPU group.

GPU groups run the AL2023 NVIDIA AMI (driver, CUDA user-mode, container toolkit, fabric manager), carry the
taint ``nvidia.com/gpu=true:NoSchedule`` so only GPU pods land there, and label nodes with their group, GPU
model and pools. Each node assembles its instance-store NVMe drives into RAID0 (nodeadm ``localStorage``) for
the model cache. One group per zone lets the autoscaler add capacity where it is missing and is required for
Capacity Blocks, which are zonal. Every launch template encrypts its root volume and enforces IMDSv2 with a hop
limit of 1, so pods cannot reach the node's instance metadata and credentials.

Every group runs the cluster's Kubernetes version (``version``), so a version bump in the stack rolls the nodes
after the control plane; CoreDNS is a versioned managed add-on created once the CPU group can run it. The
scaling config follows `infra.node_scaling`: a day-2 change of a group's bounds carries a desired size EKS
accepts. Nodes may pull from ECR (``AmazonEC2ContainerRegistryPullOnly``) and are reachable with SSM Session
Manager (``AmazonSSMManagedInstanceCore``; no SSH key, no open port) to debug nodeadm, the RAID or the GPUs. A GPU
group that runs a prefill/decode pool gets EFA interfaces in an EFA security group and a cluster placement group
(`infra.efa_cloud`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from fleet.capacity.catalog import GPUS, INSTANCES
from fleet.protocol import contract
from fleet.spec.stack import FleetSpec, GpuNodeGroupSpec
from infra.cluster import addon_version
from infra.efa import EFA_DEVICES, EFA_NODE_LABEL, efa_node_groups
from infra.efa_cloud import EfaSecurityGroup, efa_network_interfaces, placement_group_name
from infra.iam import ServiceRole, service_role
from infra.node_scaling import live_scaling, plan_scaling
from infra.node_userdata import node_user_data

__all__ = [
    "CAPACITY_TYPES",
    "GPU_AMI_TYPE",
    "NODE_POLICIES",
    "NodeGroups",
    "NodeGroupsArgs",
    "gpu_node_labels",
    "node_user_data",
]

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
CPU_AMI_TYPE = "AL2023_x86_64_STANDARD"
CAPACITY_TYPES = {"on-demand": "ON_DEMAND", "spot": "SPOT", "capacity-block": "CAPACITY_BLOCK"}
# PullOnly, not ReadOnly: nodes pull images and never list or describe repositories. SSM core: a shell on a node
# through Session Manager, the only way onto a node (no SSH key, no inbound port).
# An EFA group's launch template parts: its interfaces and its cluster placement group's name (None: none).
_Efa = tuple[list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict], pulumi.Input[str] | None]
NODE_POLICIES = ["AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly", "AmazonSSMManagedInstanceCore"]


def gpu_node_labels(spec: FleetSpec, group: GpuNodeGroupSpec) -> dict[str, str]:
    """Node labels of a GPU group: role, group, GPU model, device-plugin opt-ins (NVIDIA; EFA where the group runs a
    P/D pool) and one label per pool whose replicas run engines there, the prefill role pools included."""
    gpu = GPUS[INSTANCES[group.instance_type].gpu]
    labels = {
        contract.LABEL_NODE_ROLE: "gpu",
        contract.LABEL_GPU_GROUP: group.name,
        contract.LABEL_GPU_MODEL: gpu.name,
        "nvidia.com/gpu.product": gpu.nvidia_product,
        "nvidia.com/gpu.present": "true",  # the device plugin's node selector (no NFD needed)
        "llmfleet.io/nvme": "raid0",
    }
    if group.name in efa_node_groups(spec):
        labels[EFA_NODE_LABEL] = "true"  # the EFA device plugin's node selector (`infra.efa_cloud`)
    for pool in spec.engine_pools:
        if pool.node_group == group.name:
            labels[f"pool.llmfleet.io/{pool.name}"] = "true"
    return labels


@dataclass(frozen=True)
class NodeGroupsArgs:
    spec: FleetSpec
    cluster_name: pulumi.Input[str]
    private_subnet_ids: dict[str, pulumi.Output[str]]
    capacity_reservations: dict[str, str] = field(default_factory=dict)  # "<group>-<zone>" -> cr-...
    tags: dict[str, str] = field(default_factory=dict)
    # What EFA groups (`infra.efa.efa_node_groups`) need: the VPC of their security group, and the cluster security
    # group their interfaces name besides it. None: no group gets EFA.
    vpc_id: pulumi.Input[str] | None = None
    cluster_security_group_id: pulumi.Input[str] | None = None


class NodeGroups(pulumi.ComponentResource):
    """The node IAM role, the CPU node group and the per-zone GPU node groups; for GPU groups running P/D pools, the
    EFA security group, their EFA interfaces and cluster placement groups (`infra.efa_cloud`)."""

    gpu_groups: dict[str, list[aws.eks.NodeGroup]]  # zone -> GPU node groups in that zone
    gpu_group_arns: list[pulumi.Output[str]]
    gpu_group_names: dict[tuple[str, str], pulumi.Output[str]]  # (GPU group, zone) -> EKS node group name
    cpu_group: aws.eks.NodeGroup
    coredns_addon: aws.eks.Addon
    efa_security_group: EfaSecurityGroup | None

    def __init__(self, name: str, args: NodeGroupsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:NodeGroups", name, None, opts)
        spec = args.spec
        self._cluster = contract.cluster_name(spec.environment)  # the plain name, to read the live node groups
        tags = {**args.tags, contract.TAG_ENVIRONMENT: spec.environment}
        role = service_role(
            f"{name}-node",
            "ec2.amazonaws.com",
            # No AmazonEKS_CNI_Policy: the VPC CNI has its own IRSA role (`infra.cluster.Cluster.cni_role`).
            NODE_POLICIES,
            self,
            tags,
        )
        cpu = spec.cpu_node_group
        cpu_template = self._launch_template(f"{name}-cpu", cpu.instance_type, 100, tags)
        cpu_scaling = plan_scaling(cpu.min_nodes, cpu.max_nodes, live_scaling(self._cluster, f"{name}-cpu"))
        self.cpu_group = aws.eks.NodeGroup(
            f"{name}-cpu",
            cluster_name=args.cluster_name,
            version=spec.cluster.kubernetes_version,
            node_role_arn=role.arn,
            subnet_ids=list(args.private_subnet_ids.values()),
            ami_type=CPU_AMI_TYPE,
            instance_types=[cpu.instance_type],
            capacity_type="ON_DEMAND",
            launch_template={"id": cpu_template.id, "version": cpu_template.latest_version.apply(str)},
            scaling_config=cpu_scaling.scaling_config,
            update_config={"max_unavailable": 1},
            labels={contract.LABEL_NODE_ROLE: "cpu"},
            tags=tags,
            opts=pulumi.ResourceOptions(
                parent=self, ignore_changes=cpu_scaling.ignore_changes, depends_on=role.attachments
            ),
        )
        self.coredns_addon = self._coredns(name, args, tags)
        self.efa_security_group = None
        if efa_node_groups(spec) and args.vpc_id is not None and args.cluster_security_group_id is not None:
            self.efa_security_group = EfaSecurityGroup(
                f"{name}-efa", args.vpc_id, tags, opts=pulumi.ResourceOptions(parent=self)
            )
        self.gpu_groups = {}
        self.gpu_group_arns = []
        self.gpu_group_names = {}
        for group in spec.gpu_node_groups:
            for zone in spec.zones_of(group):
                node_group = self._gpu_group(name, args, group, zone, role, tags)
                self.gpu_groups.setdefault(zone, []).append(node_group)
                self.gpu_group_arns.append(node_group.arn)
                self.gpu_group_names[(group.name, zone)] = node_group.node_group_name
        self.register_outputs(
            {
                "cpuNodeGroup": self.cpu_group.node_group_name,
                "gpuNodeGroups": {z: [g.node_group_name for g in gs] for z, gs in self.gpu_groups.items()},
            }
        )

    def _coredns(self, name: str, args: NodeGroupsArgs, tags: dict[str, str]) -> aws.eks.Addon:
        """CoreDNS runs on the CPU nodes (it tolerates no GPU taint): made after the group, or it never turns
        ACTIVE."""
        return aws.eks.Addon(
            f"{name}-coredns",
            cluster_name=args.cluster_name,
            addon_name="coredns",
            addon_version=addon_version("coredns", args.spec.cluster.kubernetes_version),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cpu_group]),
        )

    def _launch_template(
        self,
        name: str,
        instance_type: str,
        root_gib: int,
        tags: dict[str, str],
        reservation: str | None = None,
        model_cache: bool = False,
        efa: _Efa | None = None,
    ) -> aws.ec2.LaunchTemplate:
        # A Capacity Block template names its instance type and its reservation.
        block = reservation is not None
        market: aws.ec2.LaunchTemplateInstanceMarketOptionsArgsDict | None = (
            {"market_type": "capacity-block"} if block else None
        )
        capacity: aws.ec2.LaunchTemplateCapacityReservationSpecificationArgsDict | None = (
            {"capacity_reservation_target": {"capacity_reservation_id": reservation}} if block else None
        )
        return aws.ec2.LaunchTemplate(
            name,
            block_device_mappings=[
                {
                    "device_name": "/dev/xvda",
                    "ebs": {
                        "volume_size": root_gib,
                        "volume_type": "gp3",
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                }
            ],
            # IMDSv2 only, one hop: the node itself reaches the instance metadata, a pod (one hop further, behind
            # the pod network) does not, so no pod can borrow the node role's credentials. Pods that call AWS
            # use IRSA (the engines, the control plane, the load balancer controller, the VPC CNI).
            metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 1, "http_endpoint": "enabled"},
            user_data=node_user_data(model_cache),
            tag_specifications=[{"resource_type": "volume", "tags": tags}],
            tags=tags,
            instance_market_options=market,
            capacity_reservation_specification=capacity,
            instance_type=instance_type if block else None,
            # EFA groups: their interfaces and cluster placement group (`_efa`).
            network_interfaces=efa[0] if efa else None,
            placement={"group_name": efa[1]} if efa and efa[1] else None,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _gpu_group(
        self,
        name: str,
        args: NodeGroupsArgs,
        group: GpuNodeGroupSpec,
        zone: str,
        role: ServiceRole,
        tags: dict[str, str],
    ) -> aws.eks.NodeGroup:
        spec = args.spec
        key = f"{group.name}-{zone}"
        reservation = None
        if group.capacity_type == "capacity-block":
            if key not in args.capacity_reservations:
                raise ValueError(
                    f"gpuNodeGroups {group.name!r} uses capacity-block: set the reservation of zone {zone} with "
                    f"`pulumi config set capacityBlocks:{key} cr-...`"
                )
            reservation = args.capacity_reservations[key]
        group_tags = {**tags, contract.TAG_GPU_GROUP: group.name, contract.TAG_ZONE: zone}
        efa = self._efa(f"{name}-{key}", args, group, zone, reservation, group_tags)
        template = self._launch_template(
            f"{name}-{key}", group.instance_type, group.root_volume_gib, group_tags, reservation, True, efa
        )
        scaling = plan_scaling(
            group.min_nodes_per_az, max(1, group.max_nodes_per_az), live_scaling(self._cluster, f"{name}-{key}")
        )
        return aws.eks.NodeGroup(
            f"{name}-{key}",
            cluster_name=args.cluster_name,
            version=spec.cluster.kubernetes_version,
            node_role_arn=role.arn,
            subnet_ids=[args.private_subnet_ids[zone]],
            ami_type=GPU_AMI_TYPE,
            instance_types=None if reservation else [group.instance_type],
            capacity_type=CAPACITY_TYPES[group.capacity_type],
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            scaling_config=scaling.scaling_config,
            update_config={"max_unavailable": 1},
            labels=gpu_node_labels(spec, group),
            taints=[{"key": contract.GPU_RESOURCE, "value": "true", "effect": "NO_SCHEDULE"}],
            tags=group_tags,
            opts=pulumi.ResourceOptions(
                parent=self, ignore_changes=scaling.ignore_changes, depends_on=role.attachments
            ),
        )

    def _efa(
        self,
        name: str,
        args: NodeGroupsArgs,
        group: GpuNodeGroupSpec,
        zone: str,
        reservation: str | None,
        tags: dict[str, str],
    ) -> _Efa | None:
        """(EFA interfaces, cluster placement group name) of a group running a P/D pool, else None. A capacity block
        gets no placement group: its reservation fixes where its instances run (`infra.efa_cloud`)."""
        security = self.efa_security_group
        if security is None or args.cluster_security_group_id is None or group.name not in efa_node_groups(args.spec):
            return None
        interfaces = efa_network_interfaces(
            EFA_DEVICES[group.instance_type], [args.cluster_security_group_id, security.id]
        )
        if reservation is not None:
            return interfaces, None
        placement = aws.ec2.PlacementGroup(
            f"{name}-placement",
            name=placement_group_name(self._cluster, group.name, zone),
            strategy="cluster",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return interfaces, placement.name
