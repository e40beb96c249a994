"""Prices: the catalogue's list prices with their sources, and what the plan and the cost ceilings make of them."""

from __future__ import annotations

import datetime

import pytest

from fleet.capacity.catalog import EKS_CONTROL_PLANE, GPUS, NAT_GATEWAY, ON_DEMAND_PRICES, instance_hour_usd
from fleet.capacity.fixed_costs import fixed_costs
from fleet.capacity.paid import instance_gpu_hour, plan_groups
from fleet.capacity.plan import plan_pool
from fleet.spec.loader import load_spec
from llmfleet.commands.plan import render_plan
from policies.cost import node_group_max_cost
from tests.support.stacks import spec as make_spec


@pytest.mark.parametrize(
    ("instance", "usd", "as_of"),
    [("p4de.24xlarge", 27.44705, "2026-01-21"), ("p4d.24xlarge", 21.957642, "2026-08-26")],
)
def test_on_demand_prices_in_us_east_1_carry_their_source_and_date(instance: str, usd: float, as_of: str) -> None:
    price = ON_DEMAND_PRICES[instance]["us-east-1"]
    assert (price.usd, price.as_of) == (usd, as_of)
    assert "instances.vantage.sh" in price.source


def test_an_a100_80gb_gpu_hour_is_an_eighth_of_a_p4de() -> None:
    assert GPUS["a100-80gb"].hour_usd == pytest.approx(3.43, abs=0.005)  # not $2.50
    assert GPUS["a100-40gb"].hour_usd == pytest.approx(2.74, abs=0.005)  # not $2.00


def test_spot_without_a_recorded_price_is_priced_at_its_on_demand_ceiling_and_says_so() -> None:
    assert instance_hour_usd("p4de.24xlarge", "us-east-1", "spot") == ON_DEMAND_PRICES["p4de.24xlarge"]["us-east-1"]
    spec = make_spec("aws", **{"gpuNodeGroups.0.capacityType": "spot"})
    hour, note = instance_gpu_hour(spec, "p4de.24xlarge", "spot")
    assert hour == pytest.approx(27.44705 / 8)
    assert note is not None and "spot nodes priced at on demand" in note


def test_an_instance_without_an_on_demand_price_falls_back_to_its_gpu_and_says_so() -> None:
    hour, note = instance_gpu_hour(make_spec("aws"), "p5e.48xlarge", "on-demand")
    assert hour == GPUS["h200-141gb"].hour_usd
    assert note is not None and "no on-demand price of p5e.48xlarge" in note


def test_a_stack_price_wins_over_the_catalogue() -> None:
    spec = make_spec("aws", **{"cost.gpuHourUsd": 2.0})
    assert instance_gpu_hour(spec, "p4de.24xlarge", "on-demand") == (2.0, None)


@pytest.mark.parametrize("stack", ["prod", "staging"])
def test_the_shipped_stacks_pay_the_catalogue_price(stack: str) -> None:
    spec = load_spec(stack).spec
    (group,) = plan_groups(spec)
    assert group.at_peak.gpu_hour_usd == pytest.approx(27.44705 / 8)


def test_prod_costs_60_thousand_a_month_at_min_and_120_at_its_maximum() -> None:
    spec = load_spec("prod").spec
    (group,) = plan_groups(spec)
    assert group.at_min.monthly_cost_usd == pytest.approx(60_109.04, abs=0.01)
    node_group = spec.gpu_node_groups[0]
    at_max = sum(
        node_group_max_cost({"scalingConfig": {"maxSize": node_group.max_nodes_per_az}}, node_group.instance_type)
        for _ in spec.zones_of(node_group)
    )
    assert at_max == pytest.approx(120_218.08, abs=0.01)
    assert spec.cost.monthly_ceiling_usd is not None and at_max <= spec.cost.monthly_ceiling_usd


def test_staging_at_its_maximum_stays_under_its_ceiling() -> None:
    spec = load_spec("staging").spec
    node_group = spec.gpu_node_groups[0]
    props = {"scalingConfig": {"maxSize": node_group.max_nodes_per_az}}
    at_max = sum(node_group_max_cost(props, node_group.instance_type, spec.cost.gpu_hour_usd) for _ in range(3))
    assert at_max == pytest.approx(60_109.04, abs=0.01)  # above the $60,000 the stack had
    assert spec.cost.monthly_ceiling_usd is not None and at_max <= spec.cost.monthly_ceiling_usd


TODAY = datetime.date(2026, 12, 1)


def test_fixed_costs_of_an_aws_stack() -> None:
    costs = {c.item: c.monthly_usd for c in fixed_costs(load_spec("prod").spec, TODAY)}
    assert costs == {
        "EKS control plane": pytest.approx(73.0),
        "NAT gateways": pytest.approx(3 * 0.045 * 730),
        "S3 gateway endpoint": 0.0,
    }
    assert (EKS_CONTROL_PLANE["extended"].usd, NAT_GATEWAY["gb"].usd) == (0.60, 0.045)
    assert fixed_costs(load_spec("dev").spec, TODAY) == []


@pytest.mark.parametrize(
    ("version", "monthly", "says"),
    [
        ("1.35", 73.0, "in standard support until 2027-03-27"),
        ("1.34", 73.0, "in standard support until 2026-12-02"),
        ("1.33", 438.0, "left standard support on 2026-07-29"),  # six times the price
    ],
)
def test_the_control_plane_costs_what_its_versions_support_costs(version: str, monthly: float, says: str) -> None:
    spec = make_spec("aws", **{"cluster.kubernetesVersion": version})
    (control_plane,) = [c for c in fixed_costs(spec, TODAY) if c.item == "EKS control plane"]
    assert control_plane.monthly_usd == pytest.approx(monthly)
    assert says in control_plane.basis


def test_plan_prints_the_fixed_costs_and_the_total_with_them() -> None:
    spec = load_spec("prod").spec
    plans = [plan_pool(spec, pool) for pool in spec.pools]
    out = render_plan(plans, plan_groups(spec, plans), spec, TODAY)
    assert "  EKS control plane    $73 ($0.10/h: Kubernetes 1.35 in standard support until 2027-03-27" in out
    assert "gpu nodes monthly cost min/peak: $60,109 / $60,109" in out
    assert "total monthly cost min/peak: $60,281 / $60,281" in out
