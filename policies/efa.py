"""EFA rules: an aws stack with a prefill/decode pool has what EFA needs to move the pool's KV cache.

A P/D pool's decode replicas pull each remote prompt's KV cache from its prefill replicas over NIXL; on aws only
EFA carries it at the speed the split assumes (over TCP Dynamo measured ~98 s TTFT against ~1 s,
ai-dynamo/dynamo@0c21bf2c:docs/kubernetes/cloud-providers/eks/efa.md). The program provides four things for each
P/D pool (`infra.efa`, `infra.efa_cloud`); each rule fails when the graph lacks one:

* ``efa-device-plugin-installed``: the ``aws-efa-k8s-device-plugin`` release, tolerating the GPU taint;
* ``efa-security-group-allows-itself``: EFA interfaces on the pool's nodes, each in a security group with
  all-protocol ingress from and egress to itself;
* ``efa-requested-by-pd-pods``: both roles' engine Deployments exist and request (and limit) ``vpc.amazonaws.com/efa``;
* ``efa-cluster-placement``: the pool's node groups launch into ``cluster`` placement groups (a capacity block's
  reservation fixes placement instead).

Which pools are P/D and where they run come from the deployed stack file (`policies.pd_pools`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs, StackValidationPolicy

from fleet.protocol import contract
from policies.common import as_int, containers, get_path, mapping, sequence
from policies.pd_pools import PdPool, launch_templates_of, pd_pools
from policies.prerequisites import HELM_CHART, HELM_RELEASE

__all__ = [
    "efa_cluster_placement",
    "efa_device_plugin_installed",
    "efa_requested_by_pd_pods",
    "efa_security_group_allows_itself",
]

EFA_CHART = "aws-efa-k8s-device-plugin"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
_INGRESS = ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "ingress")
_EGRESS = ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "egress")
_LEGACY_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
_ALL_PROTOCOLS = frozenset({"-1", "all"})


def _tolerates_gpu_taint(toleration: Mapping[str, Any]) -> bool:
    if toleration.get("effect") not in (None, "", "NoSchedule"):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", contract.GPU_RESOURCE)
    return toleration.get("key") == contract.GPU_RESOURCE and str(toleration.get("value")) == "true"


def efa_device_plugin_installed_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = list(args.resources)
    pools = pd_pools(resources)
    if not pools:
        return
    releases = [
        r
        for r in resources
        if r.resource_type in (HELM_RELEASE, HELM_CHART)
        and str(r.props.get("chart") or "").rstrip("/").rsplit("/", 1)[-1] == EFA_CHART
    ]
    tolerant = [
        r
        for r in releases
        if any(_tolerates_gpu_taint(mapping(t)) for t in sequence(get_path(r.props, "values", "tolerations")))
    ]
    if tolerant:
        return
    why = "its release does not tolerate the GPU taint (nvidia.com/gpu)" if releases else "no such release"
    report_violation(
        f"P/D pool(s) {', '.join(p.name for p in pools)} need the EFA device plugin ({EFA_CHART}) on their GPU "
        f"nodes, but the stack has {why}. Risk: no node advertises {EFA_RESOURCE}, so P/D pods that request it "
        "stay Pending, or, without the request, NIXL moves the KV cache over TCP at a hundred times the TTFT.",
        pools[0].anchor,
    )


def _self_groups(resources: Sequence[PolicyResource]) -> set[str]:
    """Security group ids with an all-protocol rule from themselves and one to themselves."""
    seen: dict[str, set[str]] = {}
    for resource in resources:
        props = resource.props
        for token, direction in (_INGRESS, _EGRESS):
            if resource.resource_type == token and str(props.get("ipProtocol")) in _ALL_PROTOCOLS:
                group = props.get("securityGroupId")
                if group is not None and props.get("referencedSecurityGroupId") == group:
                    seen.setdefault(str(group), set()).add(direction)
        if resource.resource_type == _LEGACY_RULE and str(props.get("protocol")) in _ALL_PROTOCOLS:
            group = props.get("securityGroupId")
            if group is not None and (props.get("self") is True or props.get("sourceSecurityGroupId") == group):
                seen.setdefault(str(group), set()).add(str(props.get("type")))
    return {group for group, directions in seen.items() if {"ingress", "egress"} <= directions}


def efa_security_group_allows_itself_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = list(args.resources)
    groups = _self_groups(resources)
    for pool in pd_pools(resources):
        templates = launch_templates_of(resources, pool.node_group or "")
        problems: list[str] = [] if templates else [f"no launch template of GPU node group {pool.node_group!r}"]
        for template in templates:
            interfaces = [mapping(i) for i in sequence(template.props.get("networkInterfaces"))]
            efa = [i for i in interfaces if i.get("interfaceType") in ("efa", "efa-only")]
            if not efa:
                problems.append(f"launch template {template.name!r} has no EFA interface")
            elif not all(groups & {str(g) for g in sequence(i.get("securityGroups"))} for i in efa):
                problems.append(f"an EFA interface of {template.name!r} is in no group allowing all traffic itself")
        if problems:
            report_violation(
                f"P/D pool {pool.name!r}: {'; '.join(problems)}. AWS: an EFA must be a member of a security group "
                "that allows all inbound and outbound traffic to and from the group itself. Risk: EFA's OS-bypass "
                "traffic is dropped, so NIXL fails or falls back to TCP and each remote prefill's TTFT balloons.",
                pool.anchor,
            )


def _efa_count(container: Mapping[str, Any]) -> tuple[int, int]:
    resources = mapping(container.get("resources"))
    return (
        as_int(mapping(resources.get("requests")).get(EFA_RESOURCE), 0) or 0,
        as_int(mapping(resources.get("limits")).get(EFA_RESOURCE), 0) or 0,
    )


def _pod_problems(pool: PdPool) -> list[str]:
    problems: list[str] = []
    for name, deployment in pool.deployments.items():
        if deployment is None:
            problems.append(f"the graph has no engine Deployment {name!r}")
            continue
        counts = [_efa_count(c) for c in containers(deployment.props)]
        if not any(request >= 1 and request == limit for request, limit in counts):
            problems.append(f"Deployment {name!r} requests no {EFA_RESOURCE} (request and limit, at least 1)")
    return problems


def efa_requested_by_pd_pods_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for pool in pd_pools(list(args.resources)):
        problems = _pod_problems(pool)
        if problems:
            report_violation(
                f"P/D pool {pool.name!r}: {'; '.join(problems)}. Risk: without its prefill Deployment every prompt "
                f"prefills on the decode replicas; without {EFA_RESOURCE} the pod gets no EFA device and NIXL moves "
                "the KV cache over TCP, a hundred times slower.",
                pool.anchor,
            )


def _capacity_block(template: PolicyResource) -> bool:
    return get_path(template.props, "capacityReservationSpecification", "capacityReservationTarget") is not None


def efa_cluster_placement_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = list(args.resources)
    cluster_groups = {
        str(r.props.get("name"))
        for r in resources
        if r.resource_type == PLACEMENT_GROUP and r.props.get("strategy") == "cluster" and r.props.get("name")
    }
    for pool in pd_pools(resources):
        templates = [t for t in launch_templates_of(resources, pool.node_group or "") if not _capacity_block(t)]
        unplaced = [
            t.name for t in templates if str(get_path(t.props, "placement", "groupName") or "") not in cluster_groups
        ]
        if unplaced:
            report_violation(
                f"P/D pool {pool.name!r}: launch template(s) {', '.join(sorted(unplaced))} name no cluster placement "
                "group of the stack. AWS recommends launching EFA instances into a cluster placement group, a "
                "low-latency group in one Availability Zone. Risk: prefill and decode nodes land far apart in the "
                "zone and every KV transfer pays the longer path.",
                pool.anchor,
            )


efa_device_plugin_installed = StackValidationPolicy(
    name="efa-device-plugin-installed",
    description="An aws stack with a P/D pool installs the EFA device plugin, tolerating the GPU taint.",
    validate=efa_device_plugin_installed_validator,
)

efa_security_group_allows_itself = StackValidationPolicy(
    name="efa-security-group-allows-itself",
    description="P/D pools' nodes have EFA interfaces in a security group allowing all traffic to and from itself.",
    validate=efa_security_group_allows_itself_validator,
)

efa_requested_by_pd_pods = StackValidationPolicy(
    name="efa-requested-by-pd-pods",
    description="Both roles of a P/D pool are deployed and request vpc.amazonaws.com/efa.",
    validate=efa_requested_by_pd_pods_validator,
)

efa_cluster_placement = StackValidationPolicy(
    name="efa-cluster-placement",
    description="P/D pools' GPU node groups launch into cluster placement groups (capacity blocks excepted).",
    validate=efa_cluster_placement_validator,
)
