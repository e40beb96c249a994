"""The frontier of fixed fleet sizes: its points are the runs of those sizes, the efficient ones are monotone in
paid GPU-hours, and a row is placed against it; the clairvoyant bound at node granularity."""

from __future__ import annotations

import pytest

from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries
from simulate.billing import NodeBilling
from simulate.bounds import clairvoyant_paid_gpu_seconds
from simulate.configs import Config, make_router
from simulate.fleet_sim import FleetSim
from simulate.frontier import Point, compare, frontier, frontier_configs, parse_sizes, point
from simulate.replay import prepare, run_all
from simulate.report import row
from simulate.trace import TraceRequest
from tests.support import stacks


def test_the_frontier_keeps_the_points_no_cheaper_point_beats_cheapest_first() -> None:
    points = [Point("a", 5.0, 0.5), Point("b", 4.0, 0.6), Point("c", 6.0, 0.55), Point("d", 7.0, 0.9)]
    assert [p.name for p in frontier(points)] == ["b", "d"]


def _long_prompts(rate: float, end_s: float) -> list[TraceRequest]:
    """2,000-token prompts at ``rate`` per second: the plan's rate per replica is about 6/s."""
    return [TraceRequest(i / rate, f"r{i}", 2000, 20) for i in range(int(rate * end_s))]


def test_a_replay_frontier_is_monotone_and_each_point_is_the_run_of_that_fixed_size() -> None:
    # dev pays its replicas' GPUs (an existing cluster): each size costs differently
    prepared = prepare("dev", _long_prompts(9.0, 150.0))
    sizes = parse_sizes(prepared.pool, None)
    assert sizes == [1, 2, 3]
    rows = [row(r, prepared) for r in run_all(prepared, frontier_configs("p2c", sizes), seed=7)]
    assert [r["peak"] for r in rows] == sizes
    front = frontier([point(r) for r in rows])
    assert len(front) >= 2
    assert all(a.paid_gpu_h < b.paid_gpu_h and a.share < b.share for a, b in zip(front, front[1:], strict=False))
    spec = load_spec("dev", registries=all_registries()).spec
    alone = FleetSim(
        spec,
        prepared.pool,
        make_router(spec, "p2c", 7),
        None,
        prepared.trace,
        name="p2c / fixed 2",
        initial_replicas=2,
        floor_rids=prepared.floor_rids,
    ).run()
    mine, direct = rows[1], row(alone, prepared)
    assert mine["configuration"] == "p2c / fixed 2"
    for key in ("paid_gpu_h", "replica_h", "within_slo_feasible", "ttft_p99", "rejected", "busy"):
        assert mine[key] == direct[key], key


def test_a_row_below_a_cheaper_fixed_size_is_below_the_frontier() -> None:
    points = [Point("fixed 3", 2.0, 0.4), Point("fixed 6", 2.0, 0.7)]
    mine = {"configuration": "p2c / scaler", "paid_gpu_h": 2.5, "within_slo_feasible": 0.5}
    oracle = {"configuration": "p2c / oracle", "paid_gpu_h": 2.0, "within_slo_feasible": 0.8}
    assert "below the frontier: fixed 6" in compare(mine, points, oracle)
    assert "1.25x the oracle's paid GPU-h, -30.0 points" in compare(mine, points, oracle)
    assert "on or above" in compare({**mine, "within_slo_feasible": 0.7}, points, None)
    assert "on or above" in compare({**mine, "paid_gpu_h": 1.0}, points, None)  # nothing costs so little


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, list(range(3, 25))), ("3..5", [3, 4, 5]), ("24,3,8,3", [3, 8, 24])],
)
def test_sizes_default_to_every_size_of_the_pool(text: str | None, expected: list[int]) -> None:
    assert parse_sizes(stacks.spec("prod").pools[0], text) == expected


@pytest.mark.parametrize("text", ["2..5", "3..25", "x", "", "5..3"])
def test_sizes_outside_the_pool_are_refused_saying_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=r"sizes of pool qwen-7b are 3\.\.24"):
        parse_sizes(stacks.spec("prod").pools[0], text)


@pytest.mark.parametrize(
    ("needed", "lead_s", "billing", "gpu_seconds"),
    [
        ([0, 9, 0], 0.0, NodeBilling(1, 8, 1, 0), 16 * 60),  # 9 replicas: two nodes of 8
        ([0, 9, 0], 60.0, NodeBilling(1, 8, 1, 0), 2 * 16 * 60),  # ordered an interval ahead
        ([3, 24, 3], 0.0, NodeBilling(1, 8, 3, 1), 3 * 24 * 60),  # prod: the per-zone minimum holds 24
        ([3, 25, 3], 0.0, NodeBilling(1, 8, 3, 1), (24 + 32 + 24) * 60),
        ([2, 2], 0.0, NodeBilling(2), 2 * 4 * 60),  # no node group: the replicas' own GPUs
    ],
)
def test_the_node_bound_pays_the_fewest_whole_nodes_of_the_need(
    needed: list[int], lead_s: float, billing: NodeBilling, gpu_seconds: float
) -> None:
    assert clairvoyant_paid_gpu_seconds(needed, 60.0, lead_s, billing.paid_gpus) == gpu_seconds


def test_fixed_configs_name_their_size() -> None:
    assert frontier_configs("p2c", [3, 5]) == [Config("p2c", "fixed", 3), Config("p2c", "fixed", 5)]
    assert Config("p2c", "fixed", 5).name == "p2c / fixed 5"
