"""paid-gpu-utilisation: fires on prod's 8-GPU nodes with the options in its message, passes where pools fit."""

from __future__ import annotations

from typing import Any

import pytest

from infra.stack_run import offline_run
from policies.pack import POLICIES
from policies.paid_capacity import paid_gpu_utilisation
from policies.runner import Violation, evaluate
from tests.policies.conftest import stack_run
from tests.support.stacks import stack_document


def _violations(stack: str, config: dict[str, Any] | None = None, **overrides: Any) -> list[Violation]:
    run = offline_run(stack_document(stack, **overrides), stack) if overrides else stack_run(stack)
    return evaluate([r for r in run.resources if r.custom], [paid_gpu_utilisation], config)


def test_fires_on_prod_with_the_paid_figures_and_every_option() -> None:
    (violation,) = _violations("prod")
    assert (violation.policy, violation.level) == ("paid-gpu-utilisation", "advisory")
    assert violation.resource is not None and violation.resource.startswith("nodes-a100-")
    message = violation.message
    assert "pays for 24 GPUs at peak and its pools use 6 (25%, target 70%)" in message
    assert "at min 3 of 24 (12%)" in message
    assert "no a100-80gb instance type with fewer than 8 GPUs a node" in message  # what the catalogue lacks
    assert "g6e.xlarge (1 x l40s-48gb)" in message  # a smaller node that holds the model, with its figure
    assert "fewer zones: not in a production stack" in message
    assert "18 GPUs idle at peak" in message  # room for more pools or models on the same nodes
    assert "capacity blocks" in message


@pytest.mark.parametrize(
    "overrides",
    [
        # 700 QPS: 20 replicas, 7 + 7 + 6 on one p4de per zone: 20 of 24 paid GPUs (83%).
        {"pools.0.workload.peakQps": 700},
        # The option the message names: one L40S per node, 8 replicas on 8 nodes.
        {"gpuNodeGroups.0.instanceType": "g6e.xlarge", "gpuNodeGroups.0.maxNodesPerAz": 3},
    ],
)
def test_passes_where_the_node_groups_fit_their_pools(overrides: dict[str, Any]) -> None:
    assert _violations("prod", **overrides) == []


def test_the_target_is_policy_config() -> None:
    assert _violations("prod", {"paid-gpu-utilisation": {"targetUtilisation": 0.25}}) == []


def test_the_pack_registers_it_as_advisory() -> None:
    (policy,) = [p for p in POLICIES if p.name == "paid-gpu-utilisation"]
    assert policy.enforcement_level is not None and policy.enforcement_level.value == "advisory"
