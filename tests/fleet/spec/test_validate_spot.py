"""`llmfleet validate` on Spot GPU groups: one instance type with no fallback rarely gets capacity.

botocore's EKS model (CreateNodegroup ``instanceTypes``): "If you specify Spot for capacityType, then we recommend
specifying multiple values for instanceTypes". A GPU group names one type, so a Spot group has no fallback.
"""

from __future__ import annotations

import pytest

from fleet.spec.loader import list_stacks, load_spec
from fleet.spec.validate import check_spec
from tests.support.stacks import spec

AWS_STACKS = [s for s in list_stacks() if load_spec(s).spec.target == "aws"]


def _capacity_problems(capacity_type: str) -> list[tuple[str, str]]:
    found = check_spec(spec("aws", **{"gpuNodeGroups.0.capacityType": capacity_type}))
    return [(p.level, p.path) for p in found if p.path.endswith(".capacityType")]


def test_a_spot_gpu_group_is_warned_about() -> None:
    assert _capacity_problems("spot") == [("warning", "llmfleet:gpuNodeGroups[0].capacityType")]


@pytest.mark.parametrize("capacity_type", ["on-demand", "capacity-block"])
def test_other_purchase_options_are_not(capacity_type: str) -> None:
    assert _capacity_problems(capacity_type) == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_no_shipped_stack_relies_on_single_type_spot(stack: str) -> None:
    assert all(group.capacity_type != "spot" for group in load_spec(stack).spec.gpu_node_groups)
