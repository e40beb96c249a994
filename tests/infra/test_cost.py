"""What the program exports as the fleet's monthly cost, and what `llmfleet validate` holds to the ceiling: the GPU
nodes, with pools that share a node group counted once."""

from __future__ import annotations

import copy

import pytest

from fleet.spec.stack import FleetSpec
from fleet.spec.validate import check_spec
from infra.program import monthly_cost
from tests.support.stacks import PRESETS, spec

ONE_NODE_A_ZONE = 3 * 27.44705 * 730  # three zones x one p4de at $27.44705 an hour on demand (us-east-1) x 730 h


def _two_pools_on_one_group(**overrides: object) -> FleetSpec:
    second = copy.deepcopy(PRESETS["aws"]["llmfleet:pools"][0])
    second.update(name="qwen-b", servedModelName="qwen-b", replicas={"min": 1, "max": 3})
    first = {**PRESETS["aws"]["llmfleet:pools"][0], "replicas": {"min": 1, "max": 3}}
    return spec("aws", pools=[first, second], **overrides)


def test_two_pools_sharing_a_node_group_pay_for_its_nodes_once() -> None:
    cost = monthly_cost(_two_pools_on_one_group())
    # Two replicas fit the per-zone minimum; the pools' own sum is twice that.
    assert cost["min"] == pytest.approx(ONE_NODE_A_ZONE, abs=0.01)


def test_the_ceiling_warning_counts_the_fleets_nodes_once() -> None:
    def warned(ceiling: float) -> list[str]:
        fleet = _two_pools_on_one_group(**{"cost.monthlyCeilingUsd": ceiling})
        return [p.path for p in check_spec(fleet) if "above the ceiling" in p.message]

    peak = monthly_cost(_two_pools_on_one_group())["peak"]
    assert warned(peak + 1) == []
    assert warned(peak - 1) == ["llmfleet:cost.monthlyCeilingUsd"]
