"""Validate cluster: zones, node groups, cost, images and cluster access checked against the catalogue and target.

Part of `fleet.spec.validate.check_spec`; each check yields `Problem`s and never raises.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Iterator

from fleet.capacity.catalog import INSTANCES, ec2_instance_types
from fleet.capacity.paid import plan_groups
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.placeholders import ROLE_ARN
from fleet.spec.stack import FleetSpec

__all__ = [
    "LOG_RETENTION_DAYS",
    "PRODUCTION_ENVIRONMENTS",
    "check_cluster_access",
    "check_cost",
    "check_images",
    "check_zones_and_groups",
]


def check_zones_and_groups(spec: FleetSpec) -> Iterator[Problem]:
    """The zones, the EC2 instance types, the CPU node group and every GPU node group, in that order."""
    yield from _check_zones(spec)
    yield from _check_ec2_types(spec)
    yield from _check_cpu_group(spec)
    yield from _check_gpu_groups(spec)


def _check_zones(spec: FleetSpec) -> Iterator[Problem]:
    zones = spec.availability_zones
    if len(set(zones)) != len(zones):
        yield _err("availabilityZones", "zones must be distinct", zones)
    if spec.target == "aws":
        for i, zone in enumerate(zones):
            if not zone.startswith(spec.region):
                yield _err(f"availabilityZones[{i}]", f"zone is not in region {spec.region!r}", zone)


def _check_ec2_types(spec: FleetSpec) -> Iterator[Problem]:
    if spec.target != "aws":
        return
    known = ec2_instance_types()
    cpu_type = spec.cpu_node_group.instance_type
    if cpu_type not in known:
        close = difflib.get_close_matches(cpu_type, sorted(known), n=3, cutoff=0.7)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        yield _err(
            "cpuNodeGroup.instanceType", f"not an EC2 instance type; {hint}(from botocore's EC2 model)", cpu_type
        )
    for i, group in enumerate(spec.gpu_node_groups):
        if group.instance_type in INSTANCES and group.instance_type not in known:
            yield _err(f"gpuNodeGroups[{i}].instanceType", "not an EC2 instance type", group.instance_type)


def _check_cpu_group(spec: FleetSpec) -> Iterator[Problem]:
    cpu = spec.cpu_node_group
    if spec.target == "aws" and cpu.instance_type.startswith(("p", "g")):
        yield _warn("cpuNodeGroup.instanceType", "a GPU instance type for the CPU node group wastes GPUs")
    if cpu.min_nodes > cpu.max_nodes:
        yield _err("cpuNodeGroup.minNodes", f"must be <= maxNodes ({cpu.max_nodes})")
    if spec.target == "aws" and cpu.min_nodes < cpu.max_nodes and cpu.autoscaler == "none":
        # A maxNodes nothing reaches is a quota asked for and a cost quoted, while HPA growth past minNodes pends.
        yield _err(
            "cpuNodeGroup.maxNodes",
            f"nothing grows the CPU group above minNodes ({cpu.min_nodes}): the fleet's autoscaler resizes only GPU "
            f"node groups and the program installs no cluster-autoscaler; set maxNodes to {cpu.min_nodes} (or leave "
            "it out), or autoscaler: external when the cluster owner runs one",
            cpu.max_nodes,
        )


def _check_gpu_groups(spec: FleetSpec) -> Iterator[Problem]:
    zones = spec.availability_zones
    names: set[str] = set()
    for i, group in enumerate(spec.gpu_node_groups):
        path = f"gpuNodeGroups[{i}]"
        if group.name in names:
            yield _err(f"{path}.name", "node group names must be unique", group.name)
        names.add(group.name)
        if group.instance_type not in INSTANCES:
            yield _err(
                f"{path}.instanceType",
                f"unknown GPU instance type; catalogue: {', '.join(INSTANCES)}",
                group.instance_type,
            )
        for j, zone in enumerate(group.zones or []):
            if zone not in zones:
                yield _err(f"{path}.zones[{j}]", f"not one of the stack's zones ({', '.join(zones)})", zone)
        if group.min_nodes_per_az > group.max_nodes_per_az:
            yield _err(f"{path}.minNodesPerAz", f"must be <= maxNodesPerAz ({group.max_nodes_per_az})")
        if spec.target == "aws" and group.capacity_type == "spot":
            yield _warn(
                f"{path}.capacityType",
                f"a Spot group runs one instance type ({group.instance_type}) and nothing falls back when it has no "
                "Spot capacity, which for large GPU types is most of the time (EKS advises several instance types "
                "for Spot); use on-demand at minNodesPerAz 0, or capacity-block",
            )


def check_cost(spec: FleetSpec) -> Iterator[Problem]:
    """The whole fleet's GPU nodes at peak against the ceiling: pools sharing a node group count its nodes once."""
    ceiling = spec.cost.monthly_ceiling_usd
    if ceiling is None:
        return
    peak = sum(g.at_peak.monthly_cost_usd for g in plan_groups(spec))
    if peak > ceiling:
        yield _warn("cost.monthlyCeilingUsd", f"the GPU nodes cost ${peak:,.0f}/month at peak, above the ceiling")


def check_images(spec: FleetSpec) -> Iterator[Problem]:
    """Cloud stacks pin their images by digest: runtime always, engine when a pool runs vLLM."""
    if spec.target == "local":
        return
    images = spec.images
    if spec.target == "aws" and images.registry is not None:
        yield _err(
            "images.registry",
            "not used on target aws: the images come from the stack's own ECR repositories "
            "(stack output imageRegistry); remove the key",
            images.registry,
        )
    if spec.target == "kubernetes" and images.registry is None:
        yield _err(
            "images.registry",
            "required on target kubernetes: where the images are pushed, e.g. ghcr.io/acme/llmfleet "
            "(pods pull <registry>/runtime@<runtimeDigest>)",
        )
    engine_pools = [f"pools[{i}] ({p.name})" for i, p in enumerate(spec.pools) if p.runs_engine_image]
    needed = [("runtimeDigest", images.runtime_digest, "runtime", f"required on target {spec.target}")]
    if engine_pools:
        needed.append(("engineDigest", images.engine_digest, "engine", f"required: {', '.join(engine_pools)} run vLLM"))
    for key, digest, image, why in needed:
        if digest is None:
            yield _err(
                f"images.{key}",
                f"{why}. `images/build.sh {image}` (or `make images IMAGES={image}`) builds the image and prints "
                f"its digest; pin it with `pulumi config set --path 'llmfleet:images.{key}' sha256:... "
                f"-s {spec.environment}` or in the stack file",
            )


PRODUCTION_ENVIRONMENTS = frozenset({"prod", "production"})  # held to the strictest cluster access rules
# What CloudWatch Logs accepts as a retention, in days.
LOG_RETENTION_DAYS = (
    *(1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545),
    *(731, 1096, 1827, 2192, 2557, 2922, 3288, 3653),
)


def check_cluster_access(spec: FleetSpec) -> Iterator[Problem]:
    """The EKS API endpoint's public CIDRs, the access-entry roles and the control-plane log retention."""
    cluster = spec.cluster
    for i, cidr in enumerate(cluster.public_endpoint_cidrs):
        path = f"cluster.publicEndpointCidrs[{i}]"
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            yield _err(path, "not a CIDR block; use an address range such as 203.0.113.0/24", cidr)
            continue
        if network.prefixlen == 0:
            what = (
                "opens the Kubernetes API endpoint to the whole internet; list your office, VPN or CI egress "
                "ranges instead (or none: the API is then reachable only from inside the VPC)"
            )
            if spec.environment in PRODUCTION_ENVIRONMENTS:
                yield _err(path, f"not allowed on a production stack: {what}", cidr)
            else:
                yield _warn(path, what)
    for key, arns in (("adminRoleArns", cluster.admin_role_arns), ("ciRoleArns", cluster.ci_role_arns)):
        for i, arn in enumerate(arns):
            if not ROLE_ARN.match(arn):
                yield _err(
                    f"cluster.{key}[{i}]", "not an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>)", arn
                )
    if cluster.log_retention_days not in LOG_RETENTION_DAYS:
        allowed = ", ".join(str(d) for d in LOG_RETENTION_DAYS)
        yield _err(
            "cluster.logRetentionDays", f"not a CloudWatch Logs retention; one of {allowed}", cluster.log_retention_days
        )
