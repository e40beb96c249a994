"""Day-2 changes of a node group's bounds: the scaling config sent carries a desired size EKS accepts.

EKS refuses ``UpdateNodegroupConfig`` with min > desired or max < desired (``InvalidParameterException: Minimum
capacity 4 can't be greater than desired size 2``, terraform-aws-modules/terraform-aws-eks#3306): a desired size
Pulumi ignores (taken from its stale state) makes raising ``minNodesPerAz`` fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from fleet.spec.loader import load_spec
from infra.node_scaling import DESIRED_SIZE, LiveScaling, ScalingPlan, plan_scaling
from tests.infra.registrations import Registrations, registrations

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


@pytest.mark.parametrize(
    ("name", "bounds", "live", "expected"),
    [
        ("new group: start at min, autoscaler owns it", (1, 4), None, ScalingPlan(1, 4, 1, True)),
        ("bounds unchanged: nothing sent", (1, 4), LiveScaling(1, 4, 3), ScalingPlan(1, 4, 3, True)),
        ("min raised above desired: desired rises to it", (4, 8), LiveScaling(1, 8, 2), ScalingPlan(4, 8, 4, False)),
        ("min raised below desired: desired kept", (2, 8), LiveScaling(1, 8, 5), ScalingPlan(2, 8, 5, False)),
        ("max lowered below desired: desired falls to it", (0, 2), LiveScaling(0, 4, 3), ScalingPlan(0, 2, 2, False)),
    ],
)
def test_plan_scaling(name: str, bounds: tuple[int, int], live: LiveScaling | None, expected: ScalingPlan) -> None:
    del name  # Unused: the case's description.
    assert plan_scaling(*bounds, live) == expected


def test_plan_scaling_refuses_inverted_bounds() -> None:
    with pytest.raises(ValueError, match="above its maximum"):
        plan_scaling(3, 2, None)


def _live_account(scaling: Mapping[str, tuple[int, int, int]]) -> dict[str, Any]:
    """Invokes answering as an account whose node groups (logical name -> min, max, desired) exist."""
    physical = {f"{logical}-1a2b3c4": logical for logical in scaling}

    def groups(args: Mapping[str, Any]) -> dict[str, Any]:
        return {"clusterName": args["clusterName"], "id": args["clusterName"], "names": sorted(physical)}

    def group(args: Mapping[str, Any]) -> dict[str, Any]:
        low, high, desired = scaling[physical[args["nodeGroupName"]]]
        config = {"minSize": low, "maxSize": high, "desiredSize": desired}
        return {"clusterName": args["clusterName"], "nodeGroupName": args["nodeGroupName"], "scalingConfigs": [config]}

    def clusters(args: Mapping[str, Any]) -> dict[str, Any]:
        del args  # Unused: ListClusters takes none.
        return {"id": "us-east-1", "names": ["llmfleet-prod", "another-cluster"]}

    return {
        "aws:eks/getClusters:getClusters": clusters,
        "aws:eks/getNodeGroups:getNodeGroups": groups,
        "aws:eks/getNodeGroup:getNodeGroup": group,
    }


def _groups(found: Registrations) -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    return {r.name: (r.props["scalingConfig"], o.ignore_changes) for r, o in found.of(NODE_GROUP)}


def test_raising_min_nodes_per_az_sends_a_desired_size_inside_the_new_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Live: zone a scaled up to 2 by the autoscaler, zone b idle at 0; prod now asks for min 1, max 2 per zone.
    cpu = load_spec("prod").spec.cpu_node_group
    live = {
        "nodes-a100-us-east-1a": (0, 2, 2),
        "nodes-a100-us-east-1b": (0, 2, 0),
        "nodes-cpu": (cpu.min_nodes, cpu.max_nodes, cpu.min_nodes),
    }
    groups = _groups(registrations(monkeypatch, invokes=_live_account(live)))
    config, ignored = groups["nodes-a100-us-east-1a"]
    assert (config["minSize"], config["maxSize"], config["desiredSize"]) == (1, 2, 2)  # the autoscaler's 2 kept
    assert DESIRED_SIZE not in ignored  # sent with the new min, not replaced by Pulumi's stale state
    config, ignored = groups["nodes-a100-us-east-1b"]
    assert (config["minSize"], config["desiredSize"]) == (1, 1) and DESIRED_SIZE not in ignored
    config, ignored = groups["nodes-cpu"]  # bounds unchanged: nothing to send, the live desired size stands
    assert (config["minSize"], config["maxSize"], config["desiredSize"]) == live["nodes-cpu"]
    assert DESIRED_SIZE in ignored
    config, ignored = groups["nodes-a100-us-east-1c"]  # not live yet: created at min, then the autoscaler's
    assert config["desiredSize"] == config["minSize"] == 1 and DESIRED_SIZE in ignored


def test_a_first_up_creates_every_group_at_its_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (config, ignored) in _groups(registrations(monkeypatch)).items():
        assert config["desiredSize"] == config["minSize"], name
        assert DESIRED_SIZE in ignored, name
