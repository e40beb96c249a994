"""The CPU node group's size is fixed unless the stack declares what resizes it.

Nothing in the fleet grows it: the aws actuator resizes only GPU node groups (control_plane/actuators/aws.py) and
the program installs no cluster-autoscaler or Karpenter. A maxNodes above minNodes would be quoted in quotas
and costs while the gateways' HPA growth past minNodes pends.
"""

from __future__ import annotations

import pytest

from fleet.spec.loader import list_stacks, load_spec, parse_spec
from llmfleet.registries import all_registries
from tests.infra.conftest import stack_run
from tests.support.stacks import assert_refused, stack_document

AWS_STACKS = [s for s in list_stacks() if load_spec(s).spec.target == "aws"]


def test_a_cpu_group_that_nothing_resizes_may_not_declare_room_to_grow() -> None:
    document = stack_document(cpuNodeGroup={"instanceType": "m6i.2xlarge", "minNodes": 3, "maxNodes": 9})
    assert_refused(document, "Pulumi.prod.yaml", "cpuNodeGroup.maxNodes", "nothing grows the CPU group")


def test_an_external_autoscaler_may_resize_it_between_its_bounds() -> None:
    document = stack_document(cpuNodeGroup={"minNodes": 3, "maxNodes": 9, "autoscaler": "external"})
    group = parse_spec(document, name="prod", registries=all_registries()).spec.cpu_node_group
    assert (group.min_nodes, group.max_nodes) == (3, 9)


@pytest.mark.parametrize(("keys", "size"), [({}, 2), ({"minNodes": 4}, 4), ({"minNodes": 5, "maxNodes": 5}, 5)])
def test_max_nodes_left_out_is_min_nodes(keys: dict[str, int], size: int) -> None:
    group = parse_spec(stack_document(cpuNodeGroup=keys), name="prod", registries=all_registries()).spec
    assert (group.cpu_node_group.min_nodes, group.cpu_node_group.max_nodes) == (size, size)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_shipped_cpu_groups_run_at_the_size_they_are_quoted_at(stack: str) -> None:
    group = load_spec(stack).spec.cpu_node_group
    assert group.min_nodes == group.max_nodes or group.autoscaler == "external"
    (node_group,) = [g for g in stack_run(stack).of_type("aws:eks/nodeGroup:NodeGroup") if g.name == "nodes-cpu"]
    config = node_group.props["scalingConfig"]
    assert config["minSize"] == config["maxSize"] == config["desiredSize"] == group.min_nodes
