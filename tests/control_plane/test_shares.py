"""The division of a pool's admission capacity among gateways (`control_plane.shares`), a pure function."""

from __future__ import annotations

import pytest

from control_plane.shares import admission_shares


def test_no_gateway_no_share() -> None:
    assert admission_shares({}, 100) == {}


def test_idle_gateways_split_evenly_and_without_capacity_too() -> None:
    assert admission_shares({"a": {}, "b": {}}, 100) == {"a": 0.5, "b": 0.5}
    assert admission_shares({"a": {5: 40}, "b": {}}, 0) == {"a": 0.5, "b": 0.5}


@pytest.mark.parametrize(
    ("demands", "capacity"),
    [
        ({"a": {1: 500}, "b": {9: 3}}, 100),
        ({"a": {1: 10}, "b": {1: 10}, "c": {}}, 100),
        ({"a": {0: 1000, 9: 1000}, "b": {5: 7}}, 64),
    ],
)
def test_shares_always_sum_to_one(demands: dict[str, dict[int, int]], capacity: int) -> None:
    assert sum(admission_shares(demands, capacity).values()) == pytest.approx(1.0)


def test_high_priority_demand_at_one_gateway_takes_capacity_from_low_priority_demand_at_another() -> None:
    shares = admission_shares({"low": {1: 300}, "high": {9: 60}}, 100, reserve=0.1)
    # 90 to share: the 60 high-priority requests fit whole, the low band gets the 30 left; 5 reserved each.
    assert shares == pytest.approx({"high": 0.65, "low": 0.35})


def test_a_band_that_does_not_fit_is_split_by_demand_and_lower_bands_get_nothing() -> None:
    shares = admission_shares({"a": {9: 150, 1: 100}, "b": {9: 30}, "c": {1: 500}}, 100, reserve=0.0)
    assert shares == pytest.approx({"a": 150 / 180, "b": 30 / 180, "c": 0.0})


def test_the_reserve_keeps_an_idle_gateway_above_zero_under_overload() -> None:
    shares = admission_shares({"busy": {5: 10_000}, "idle": {}}, 100, reserve=0.2)
    assert shares["idle"] == pytest.approx(0.1)
    assert shares["busy"] == pytest.approx(0.9)


def test_demand_below_capacity_leaves_the_rest_split_evenly() -> None:
    shares = admission_shares({"a": {1: 20}, "b": {1: 0}}, 100, reserve=0.0)
    assert shares == pytest.approx({"a": 0.6, "b": 0.4})  # 20 asked, 80 left split evenly
