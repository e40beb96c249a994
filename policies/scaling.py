"""Scaling rules: every GPU node group whose size may change has something that changes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, StackValidationArgs, StackValidationPolicy

from fleet.protocol import contract
from policies.common import DEPLOYMENT, NODE_GROUP, annotations_of, containers, get_path, is_gpu_node_group, labels

__all__ = ["gpu_nodes_can_scale"]

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def _resizable_arns(resources: Any) -> set[str]:
    """Node group ARNs some inline role policy allows ``eks:UpdateNodegroupConfig`` on."""
    arns: set[str] = set()
    for resource in resources:
        if resource.resource_type != ROLE_POLICY or not isinstance(resource.props.get("policy"), str):
            continue
        for statement in json.loads(resource.props["policy"]).get("Statement", []):
            actions = statement.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            if statement.get("Effect") == "Allow" and "eks:UpdateNodegroupConfig" in actions:
                found = statement.get("Resource", [])
                arns |= {found} if isinstance(found, str) else set(found)
    return arns


def _scaler(resources: Any) -> tuple[str, set[str]]:
    """The control plane's actuator ('' when none) and the node group names its arguments give it."""
    for resource in resources:
        if resource.resource_type != DEPLOYMENT:
            continue
        if labels(resource.props).get(contract.LABEL_COMPONENT) != contract.COMPONENT_CONTROL_PLANE:
            continue
        actuator = str(annotations_of(resource.props).get(contract.ANN_ACTUATOR, ""))
        names: set[str] = set()
        for container in containers(resource.props):
            args = [str(a) for a in container.get("args") or []]
            names |= {args[i + 1].split("=", 1)[-1] for i, a in enumerate(args[:-1]) if a == "--nodegroup"}
        return actuator, names
    return "", set()


def gpu_nodes_can_scale_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    groups = [r for r in args.resources if r.resource_type == NODE_GROUP and is_gpu_node_group(r.props)]
    if not groups:
        return
    actuator, named = _scaler(args.resources)
    resizable = _resizable_arns(args.resources)
    for group in groups:
        scaling: Mapping[str, Any] = get_path(group.props, "scalingConfig") or {}
        low, high = int(scaling.get("minSize", 0)), int(scaling.get("maxSize", 0))
        if high <= low:
            continue  # a fixed size: nothing needs to change it
        name, arn = group.props.get("nodeGroupName"), group.props.get("arn")
        missing = []
        if actuator != "aws":
            missing.append(f"the control plane's actuator is {actuator or 'absent'!r}, not 'aws'")
        if isinstance(name, str) and name not in named:
            missing.append("the control plane is not given its name (--nodegroup)")
        if isinstance(arn, str) and arn not in resizable:
            missing.append("no role may call eks:UpdateNodegroupConfig on it")
        if missing:
            floor = "it stays at 0 nodes and its pools never run" if low == 0 else f"it stays at {low} node(s)"
            report_violation(
                f"GPU node group {name or group.name!r} may hold {low}..{high} nodes but nothing can add nodes: "
                f"{'; '.join(missing)}. Risk: {floor}; engine pods sit Pending and autoscaling saves no GPU money.",
                group.urn,
            )


gpu_nodes_can_scale = StackValidationPolicy(
    name="gpu-nodes-can-scale",
    description="Each GPU node group with a size range is resized by the control plane (aws actuator, IAM, name).",
    validate=gpu_nodes_can_scale_validator,
)
