"""The paid floor: the replicas a pool keeps so that its node group's minimum nodes serve, shared by their pools."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.capacity.paid_floor import Claim, PaidFloor, fill_paid_nodes, paid_floor
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


def _two_pools(split: str = "demand") -> FleetSpec:
    return make_spec("prod-two-models", **{"gpuNodeGroups.0.paidSplit": split})


def _moving(claims: dict[str, Claim]) -> dict[str, tuple[int, int | None]]:
    spec = _two_pools()
    return {p.name: ((f := paid_floor(spec, p, claims)) and (f.replicas, f.cap)) for p in spec.pools}


@pytest.mark.parametrize(
    ("case", "claims", "expected"),
    [
        ("no claims yet: the even split", {}, {"qwen-7b": (12, None), "llama-8b": (12, None)}),
        (
            "one pool has not claimed: the even split",
            {"qwen-7b": Claim(20, 12)},
            {"qwen-7b": (12, None), "llama-8b": (12, None)},
        ),
        (
            "equal wants: the even split, nothing moves",
            {"qwen-7b": Claim(3, 12), "llama-8b": (c := Claim(3, 12))},
            {"qwen-7b": (12, None), "llama-8b": (12, None)},
        ),
        (
            # qwen wants 20: its share is 20 and more, llama keeps its 3 and a share of the rest in proportion
            # to the wants; qwen's floor cannot rise yet (no GPU is free), llama is capped at its share
            "a pool that wants more than it holds makes the other yield",
            {"qwen-7b": Claim(20, 12), "llama-8b": c},
            {"qwen-7b": (12, None), "llama-8b": (3, 3)},
        ),
        (
            "the yielded GPUs free: the floor rises into them",
            {"qwen-7b": Claim(20, 12), "llama-8b": Claim(3, 3)},
            {"qwen-7b": (21, None), "llama-8b": (3, None)},
        ),
        (
            # qwen's floor rises by the 4 free GPUs; llama's falls to its share, and it shrinks to it only
            # through its own scale-down window
            "free GPUs cover the want: nobody yields",
            {"qwen-7b": Claim(14, 12), "llama-8b": Claim(3, 8)},
            {"qwen-7b": (16, None), "llama-8b": (6, None)},
        ),
        (
            "a pool never yields below its own want",
            {"qwen-7b": Claim(20, 12), "llama-8b": Claim(9, 12)},
            {"qwen-7b": (12, None), "llama-8b": (9, 9)},
        ),
    ],
)
def test_moving_floors(case: str, claims: dict[str, Claim], expected: dict[str, tuple[int, int | None]]) -> None:
    assert _moving(claims) == expected, case


def test_moving_floors_never_hand_out_more_than_the_paid_gpus() -> None:
    spec = _two_pools()
    for want_a in (0, 3, 12, 24):
        for want_b in (0, 3, 12, 24):
            for held_a in (3, 12, 21):
                claims = {"qwen-7b": Claim(want_a, held_a), "llama-8b": Claim(want_b, 24 - held_a)}
                floors = [paid_floor(spec, p, claims) for p in spec.pools]
                assert sum(f.replicas for f in floors if f is not None) <= 24, claims


def test_the_even_split_the_default_ignores_claims() -> None:
    spec = _two_pools("even")
    claims = {"qwen-7b": Claim(20, 12), "llama-8b": Claim(3, 12)}
    assert [paid_floor(spec, p, claims) for p in spec.pools] == [PaidFloor(12, 24), PaidFloor(12, 24)]
    assert make_spec("prod-two-models").gpu_node_groups[0].paid_split == "even"
