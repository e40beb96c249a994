"""What a replay bills: whole nodes of the pool's GPU group (per-zone minimum, packing), or an existing
cluster's GPUs, integrated over the replicas billed at each tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries
from simulate.billing import NodeBilling
from simulate.configs import stack_config
from simulate.replay import prepare, run_config
from simulate.report import row
from simulate.trace import synthetic_trace
from tests.support.stacks import write_stack


def _billing(stack: str) -> NodeBilling:
    spec = load_spec(stack, registries=all_registries()).spec
    return NodeBilling.for_pool(spec, spec.pools[0])


@pytest.mark.parametrize(
    ("replicas", "nodes", "paid_gpus"),
    [
        (0, 3, 24),  # one p4de per zone at minimum, whatever runs
        (3, 3, 24),
        (24, 3, 24),  # 8 replicas of 1 GPU in each zone fill its node
        (25, 4, 32),  # the 25th opens a second node in the first zone
        (48, 6, 48),
    ],
)
def test_prod_pays_whole_p4de_nodes_with_one_per_zone_at_least(replicas: int, nodes: int, paid_gpus: int) -> None:
    billing = _billing("prod")
    assert (billing.nodes(replicas), billing.paid_gpus(replicas)) == (nodes, paid_gpus)


def test_a_pool_without_a_node_group_pays_its_replicas_gpus() -> None:
    billing = NodeBilling(tensor_parallel=2)
    assert (billing.nodes(5), billing.paid_gpus(5)) == (0, 10)


@pytest.mark.parametrize("fill", [False, True])
def test_a_replay_bills_paid_gpu_hours_and_their_busy_share(tmp_path: Path, fill: bool) -> None:
    # fillPaidNodes off, the scaler runs the few replicas the traffic needs and idle paid GPUs lower paid busy;
    # on (prod as shipped) the paid floor puts a replica on every paid GPU, so paid busy is replica busy.
    stack = str(write_stack(tmp_path / "Pulumi.prod.yaml", "prod", **{"pools.0.replicas.fillPaidNodes": fill}))
    prepared = prepare(stack, synthetic_trace(20.0, seed=1, end_s=300.0))
    result = run_config(prepared, stack_config(load_spec(stack, registries=all_registries()).spec), seed=0)
    figures = row(result, prepared)
    assert result.peak_replicas <= 24  # never beyond the three nodes prod pays at its minimum
    assert figures["paid_gpu_h"] == pytest.approx(24 * result.end_s / 3600, rel=0.02)
    assert figures["node_h"] == pytest.approx(3 * result.end_s / 3600, rel=0.02)
    if fill:
        assert result.peak_replicas == 24
        assert 0 < float(figures["paid_busy"]) == pytest.approx(float(figures["busy"]), rel=0.02)
    else:
        assert 0 < float(figures["paid_busy"]) < float(figures["busy"])  # idle paid GPUs lower it
