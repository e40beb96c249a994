"""The paid floor: the replicas a pool keeps so that its node group's minimum nodes serve, shared by their pools."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.capacity.paid_floor import PaidFloor, fill_paid_nodes, paid_floor
from fleet.spec.stack import FleetSpec
from tests.fleet.capacity.builders import a100_pool
from tests.support.stacks import spec as make_spec


def _pool(name: str, tp: int, replicas: tuple[int, int], fill: bool = True) -> dict[str, Any]:
    return a100_pool(name, tp, replicas, fill_paid=fill)


def _floors(spec: FleetSpec) -> dict[str, PaidFloor | None]:
    return {p.name: paid_floor(spec, p) for p in spec.pools}


def test_prod_fills_its_three_p4de_nodes_with_24_replicas() -> None:
    spec = make_spec("prod")
    assert spec.pools[0].replicas.fill_paid_nodes  # the default
    assert _floors(spec) == {"qwen-7b": PaidFloor(24, 24)}


@pytest.mark.parametrize(
    ("name", "pools", "expected"),
    [
        ("tensor parallel 2: four a node", [_pool("big", 2, (3, 24))], {"big": 12}),
        ("capped at max", [_pool("chat", 1, (3, 12))], {"chat": 12}),
        ("fillPaidNodes off: no floor", [_pool("chat", 1, (3, 24), fill=False)], {"chat": None}),
        (
            "two pools share the nodes, GPUs held evenly",
            [_pool("chat", 1, (3, 24)), _pool("batch", 1, (1, 24))],
            {"chat": 12, "batch": 12},
        ),
        (
            # 20 would spread 7, 7, 6 beside batch's 2, 1, 1: nine in the first zone, a node beyond the minimum.
            "a pool capped at max leaves its share to the other, as far as the zone spread allows",
            [_pool("chat", 1, (3, 24)), _pool("batch", 1, (1, 4))],
            {"chat": 18, "batch": 4},
        ),
        (
            "shared by GPUs: TP=2 and TP=1 hold 12 GPUs each",
            [_pool("chat", 1, (3, 24)), _pool("big", 2, (1, 24))],
            {"chat": 12, "big": 6},
        ),
        (
            "a pool that does not fill keeps its min and takes no share",
            [_pool("chat", 1, (3, 24)), _pool("batch", 1, (6, 24), fill=False)],
            {"chat": 18, "batch": None},
        ),
    ],
)
def test_paid_floor(name: str, pools: list[dict[str, Any]], expected: dict[str, int | None]) -> None:
    del name  # Unused: names the case.
    floors = _floors(make_spec("aws", pools=pools))
    assert {k: None if f is None else f.replicas for k, f in floors.items()} == expected
    assert {f.paid_gpus for f in floors.values() if f is not None} <= {24}


def test_the_floor_never_needs_a_node_beyond_the_minimum() -> None:
    # Two zones of one 8-GPU node and a TP=4 pool beside a TP=1 one: 4 + 4x1 per node, nothing over.
    assert fill_paid_nodes([0, 0], [24, 24], [4, 1], [True, True], 2, 8, 1) == [2, 8]
    # Seven TP=1 replicas in three zones would put 3 in the first zone: the floor stops where the spread fits.
    assert fill_paid_nodes([0], [24], [1], [True], 3, 2, 1) == [6]


@pytest.mark.parametrize(
    ("name", "preset", "overrides"),
    [
        ("local target: nothing is paid by the node", "local-sim", {}),
        ("no minimum nodes", "aws", {"gpuNodeGroups.0.minNodesPerAz": 0, "pools.0.replicas": {"min": 1, "max": 12}}),
    ],
)
def test_no_floor_where_no_node_is_paid_at_minimum(name: str, preset: str, overrides: dict[str, Any]) -> None:
    del name  # Unused: names the case.
    spec = make_spec(preset, **overrides)
    assert _floors(spec) == {p.name: None for p in spec.pools}
