"""Paid capacity counts whole nodes per zone with every pool's replicas packed on them, at min and at peak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.capacity.paid import GroupPlan, pack_zone, paid_options, plan_groups, zone_shares
from fleet.spec.stack import FleetSpec
from tests.fleet.capacity.builders import a100_pool
from tests.support.stacks import spec as make_spec

ROOT = Path(__file__).resolve().parents[3]


def _workload(peak_qps: float) -> dict[str, Any]:
    """A measured 50 QPS per replica and no buffer, so peak replicas are ceil(peak_qps / 50)."""
    return {"peakQps": peak_qps, "perReplicaQps": 50, "capacityBuffer": 0}


def _pool(name: str, tp: int, replicas: tuple[int, int], peak_qps: float) -> dict[str, Any]:
    return a100_pool(name, tp, replicas, workload=_workload(peak_qps))


def _group(spec: FleetSpec) -> GroupPlan:
    (group,) = plan_groups(spec)
    return group


@pytest.mark.parametrize(
    ("replicas", "zones", "expected"),
    [(6, 3, [2, 2, 2]), (7, 3, [3, 2, 2]), (2, 3, [1, 1, 0]), (0, 2, [0, 0])],
)
def test_zone_shares_are_even_with_the_remainder_in_the_first_zones(
    replicas: int, zones: int, expected: list[int]
) -> None:
    assert zone_shares(replicas, zones) == expected


@pytest.mark.parametrize(
    ("name", "replica_gpus", "per_node", "nodes"),
    [
        ("nothing to place", [], 8, 0),
        ("eight tp1 replicas fill one node", [1] * 8, 8, 1),
        ("a ninth needs a second node", [1] * 9, 8, 2),
        ("tp4 and tp2 and tp1 share", [4, 2, 1, 1], 8, 1),
        ("two tp4 fill a node, the rest goes on a second", [4, 4, 2, 2, 1, 1], 8, 2),
        ("a replica never spans nodes", [4, 4, 4], 8, 2),
        ("one-gpu nodes hold one replica each", [1, 1, 1], 1, 3),
    ],
)
def test_pack_zone(name: str, replica_gpus: list[int], per_node: int, nodes: int) -> None:
    assert pack_zone(replica_gpus, per_node) == nodes, name


def test_prod_pays_for_24_gpus_and_uses_6_at_peak() -> None:
    group = _group(make_spec("prod"))
    assert (group.at_min.nodes_per_zone, group.at_peak.nodes_per_zone) == ([1, 1, 1], [1, 1, 1])
    assert (group.at_min.paid_gpus, group.at_min.used_gpus) == (24, 3)
    assert (group.at_peak.paid_gpus, group.at_peak.used_gpus) == (24, 6)
    assert group.at_peak.paid_utilisation == 0.25
    assert group.at_min.paid_utilisation == 0.125
    assert group.at_peak.node_hours_month == 3 * 730
    # p4de.24xlarge on demand in us-east-1: $27.44705 an instance-hour (fleet.capacity.catalog), not the old $2.50 a
    # GPU.
    assert group.at_min.monthly_cost_usd == group.at_peak.monthly_cost_usd == pytest.approx(3 * 27.44705 * 730)


def test_the_per_zone_minimum_is_paid_even_when_replicas_need_less() -> None:
    # Peak 100 QPS -> 2 replicas, raised to min 3: one per zone, each on a node the minimum pays for anyway.
    group = _group(make_spec("aws", **{"pools.0.workload": _workload(100)}))
    assert group.at_peak.replicas == 3
    assert (group.at_peak.paid_gpus, group.at_peak.used_gpus) == (24, 3)


def test_without_a_minimum_a_zone_with_no_replica_pays_nothing() -> None:
    spec = make_spec(
        "aws",
        **{
            "gpuNodeGroups.0.minNodesPerAz": 0,
            "pools.0.replicas": {"min": 1, "max": 12},
            "pools.0.workload": _workload(100),
        },
    )
    group = _group(spec)
    assert group.at_min.nodes_per_zone == [1, 0, 0]
    assert group.at_peak.nodes_per_zone == [1, 1, 0]
    assert (group.at_min.paid_gpus, group.at_peak.paid_gpus) == (8, 16)


@pytest.mark.parametrize(
    ("peak_qps", "nodes_per_zone", "paid", "used"),
    [
        (600, [1, 1, 1], 24, 24),  # 12 TP-2 replicas: 4 per zone = 8 GPUs = one node each
        (650, [2, 1, 1], 32, 26),  # 13: the first zone's 5 replicas need 10 GPUs, a second node
    ],
)
def test_tensor_parallel_two_packs_four_replicas_a_node(
    peak_qps: float, nodes_per_zone: list[int], paid: int, used: int
) -> None:
    spec = make_spec(
        "aws",
        **{
            "pools.0.engine.tensorParallelSize": 2,
            "pools.0.replicas": {"min": 3, "max": 16},
            "pools.0.workload": _workload(peak_qps),
        },
    )
    group = _group(spec)
    assert (group.at_peak.nodes_per_zone, group.at_peak.paid_gpus, group.at_peak.used_gpus) == (
        nodes_per_zone,
        paid,
        used,
    )


def test_two_pools_on_one_node_group_pack_together() -> None:
    # Per zone at peak: 2 TP-1 replicas of "chat" (2 GPUs) and 1 TP-2 replica of "batch" (2 GPUs): one node.
    two = make_spec("aws", pools=[_pool("chat", 1, (3, 12), 300), _pool("batch", 2, (3, 6), 150)])
    group = _group(two)
    assert group.pools == ["chat", "batch"]
    assert group.at_peak.nodes_per_zone == [1, 1, 1]
    assert (group.at_peak.paid_gpus, group.at_peak.used_gpus) == (24, 12)
    assert group.at_peak.paid_utilisation == 0.5
    # Each pool alone would pay for the same 24 GPUs: sharing halves the bill of the two.
    assert group.at_peak.monthly_cost_usd == pytest.approx(3 * 27.44705 * 730)


def test_two_pools_that_overflow_a_node_add_a_node_per_zone() -> None:
    # Per zone at peak: 2 TP-4 replicas (8 GPUs) + 2 TP-1 replicas (2 GPUs) = 10 GPUs: two nodes.
    two = make_spec("aws", pools=[_pool("chat", 1, (3, 12), 300), _pool("big", 4, (3, 6), 300)])
    group = _group(two)
    assert group.at_peak.nodes_per_zone == [2, 2, 2]
    assert (group.at_peak.paid_gpus, group.at_peak.used_gpus) == (48, 30)
    assert group.at_min.nodes_per_zone == [1, 1, 1]  # 1 TP-4 + 1 TP-1 per zone: 5 GPUs on one node
    assert (group.at_min.paid_gpus, group.at_min.used_gpus) == (24, 15)


def test_options_under_the_target_name_instance_types_sharing_and_reservations() -> None:
    spec = make_spec("prod")
    options = paid_options(spec, _group(spec))
    kinds = [o.kind for o in options]
    assert {"instance-type", "zones", "sharing", "reservation"} <= set(kinds)
    texts = " | ".join(o.text for o in options)
    assert "no a100-80gb instance type with fewer than 8 GPUs" in texts
    assert "not in a production stack" in texts
    smaller = [o for o in options if o.kind == "instance-type" and o.paid_utilisation is not None]
    assert smaller and all(o.monthly_cost_usd is not None and o.monthly_cost_usd < 43_800 for o in smaller)


def test_fewer_zones_is_an_option_outside_prod_with_its_figure() -> None:
    spec = make_spec("staging")
    zones = [o for o in paid_options(spec, _group(spec)) if o.kind == "zones"]
    assert [o.paid_utilisation for o in zones] == [2 / 16, 2 / 8]
    assert zones[-1].text.startswith("1 zone instead of 3: 8 paid GPUs")


def test_no_options_at_or_above_the_target() -> None:
    spec = make_spec("aws", **{"pools.0.workload": _workload(1000), "pools.0.replicas": {"min": 3, "max": 24}})
    group = _group(spec)
    assert group.at_peak.paid_utilisation >= 0.7
    assert paid_options(spec, group) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", "plan", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _row(out: str, key: str) -> str:
    (line,) = [line for line in out.splitlines() if line.strip().startswith(key)]
    return line.strip()[len(key) :].strip()


def test_plan_prod_prints_paid_gpus_and_their_utilisation_at_min_and_peak() -> None:
    result = _cli("--stack", "prod")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert _row(out, "paid gpus min/peak") == "24 / 24"
    assert _row(out, "used gpus min/peak") == "3 / 6"
    assert _row(out, "paid-gpu utilisation min/peak") == "12% / 25% (target 70% at peak)"
    assert _row(out, "replica utilisation at peak") == "72% (200 qps on 6 x 46.0)"
    assert _row(out, "node-hours a month min/peak") == "2,190 / 2,190"
    assert _row(out, "monthly cost min/peak") == "$60,109 / $60,109"  # 3 x p4de at $27.447 an hour
    assert "under the 70% target (18 of 24 paid GPUs idle). Options:" in out


def test_plan_json_carries_the_paid_capacity() -> None:
    result = _cli("--stack", "prod", "--json")
    assert result.returncode == 0, result.stderr
    (group,) = json.loads(result.stdout)["node_groups"]
    assert (group["at_peak"]["paid_gpus"], group["at_peak"]["used_gpus"]) == (24, 6)
    assert group["at_min"]["paid_utilisation"] == 0.125
    assert {o["kind"] for o in group["options"]} == {"instance-type", "zones", "sharing", "reservation"}


def test_a_node_group_no_pool_names_still_pays_for_its_minimum() -> None:
    idle = {"name": "spare", "instanceType": "g6e.12xlarge", "minNodesPerAz": 1, "maxNodesPerAz": 1}
    a100 = make_spec("aws").gpu_node_groups[0].model_dump(by_alias=True)
    spec = make_spec("aws", gpuNodeGroups=[a100, idle])
    spare = [g for g in plan_groups(spec) if g.group == "spare"][0]
    assert (spare.pools, spare.at_min.paid_gpus, spare.at_peak.used_gpus) == ([], 12, 0)
    (option,) = paid_options(spec, spare)
    assert "no pool names node group 'spare'" in option.text
