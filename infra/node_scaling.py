"""Node scaling: the scaling config a managed node group is registered with, from its bounds and its live state.

The desired size belongs to the autoscaler, so Pulumi normally ignores it. But EKS refuses an
``UpdateNodegroupConfig`` whose desired size lies outside ``[min, max]`` (``InvalidParameterException: Minimum
capacity 4 can't be greater than desired size 2``), and when the stack changes a group's bounds the provider sends
the whole scaling config, with the desired size from Pulumi's state, which the autoscaler has since moved. So
before registering a group the program reads its live scaling config (``eks:ListClusters``,
``eks:ListNodegroups``, ``eks:DescribeNodegroup``, `live_scaling`) and `plan_scaling` decides:

* no live group (first ``up``, or the read is not allowed): desired = min, and Pulumi ignores later changes;
* the bounds are unchanged: nothing is sent, desired stays ignored, so the autoscaler's value stands;
* the bounds change: desired = the live desired size clamped into the new ``[min, max]``, sent with them, so raising
  ``minNodesPerAz`` (or lowering ``maxNodesPerAz``) on day 2 succeeds and never undoes more of the autoscaler's
  decision than the new bounds require.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi_aws as aws

__all__ = ["DESIRED_SIZE", "LiveScaling", "ScalingPlan", "live_scaling", "plan_scaling"]

DESIRED_SIZE = "scalingConfig.desiredSize"  # the property path `ignore_changes` names


@dataclass(frozen=True)
class LiveScaling:
    """A node group's scaling config as EKS reports it now."""

    min_size: int
    max_size: int
    desired_size: int


@dataclass(frozen=True)
class ScalingPlan:
    """What to register: the ``scaling_config`` input and whether Pulumi ignores changes to its desired size."""

    min_size: int
    max_size: int
    desired_size: int
    ignore_desired: bool

    @property
    def scaling_config(self) -> aws.eks.NodeGroupScalingConfigArgsDict:
        return {"min_size": self.min_size, "max_size": self.max_size, "desired_size": self.desired_size}

    @property
    def ignore_changes(self) -> list[str]:
        return [DESIRED_SIZE] if self.ignore_desired else []


def plan_scaling(min_size: int, max_size: int, live: LiveScaling | None) -> ScalingPlan:
    """The scaling config for bounds ``[min_size, max_size]`` given the group's ``live`` state (None: none yet)."""
    if min_size > max_size:
        raise ValueError(f"a node group's minimum {min_size} is above its maximum {max_size}")
    if live is None:
        return ScalingPlan(min_size, max_size, min_size, ignore_desired=True)
    if (live.min_size, live.max_size) == (min_size, max_size):
        return ScalingPlan(min_size, max_size, live.desired_size, ignore_desired=True)
    desired = min(max(live.desired_size, min_size), max_size)
    return ScalingPlan(min_size, max_size, desired, ignore_desired=False)


def live_scaling(cluster_name: str, logical_name: str) -> LiveScaling | None:
    """The live scaling config of the group Pulumi auto-named from ``logical_name`` (``<logical>-<7 hex>``) in
    ``cluster_name``; None when the cluster or the group does not exist yet or cannot be read."""
    try:
        # ListClusters first: on a first `up` there is no cluster, and ListNodegroups would fail on it.
        if cluster_name not in (aws.eks.get_clusters().names or []):
            return None
        names = aws.eks.get_node_groups(cluster_name=cluster_name).names or []
    except Exception:  # noqa: BLE001 - no read permission: plan as for a new group (the desired size ignored)
        return None
    pattern = re.compile(rf"{re.escape(logical_name)}-[0-9a-f]{{7}}")
    matches = [n for n in names if pattern.fullmatch(n)]
    if len(matches) != 1:
        return None
    try:
        group = aws.eks.get_node_group(cluster_name=cluster_name, node_group_name=matches[0])
    except Exception:  # noqa: BLE001 - deleted between the two reads
        return None
    configs = group.scaling_configs or []
    if not configs:
        return None
    config = configs[0]
    return LiveScaling(int(config.min_size), int(config.max_size), int(config.desired_size))
