"""The EFA rules on the program's graph: a P/D stack on aws passes the pack, and losing any EFA part trips its rule."""

from __future__ import annotations

from typing import Any

import pytest

from infra.stack_run import offline_run
from policies.efa import (
    efa_cluster_placement,
    efa_device_plugin_installed,
    efa_requested_by_pd_pods,
    efa_security_group_allows_itself,
)
from policies.pack import POLICIES
from policies.runner import evaluate
from tests.policies.conftest import stack_run
from tests.policies.pd_graph import ALSO_MISSING, MISSING, PD_OVERRIDES, Graph, edit, pd_graph
from tests.support.stacks import stack_document

EFA_POLICIES = [
    efa_device_plugin_installed,
    efa_security_group_allows_itself,
    efa_requested_by_pd_pods,
    efa_cluster_placement,
]


def _tripped(graph: Graph) -> set[str]:
    return {v.policy for v in evaluate(graph, EFA_POLICIES)}


def test_the_pd_stack_passes_the_pack_with_only_the_paid_capacity_advisory() -> None:
    violations = evaluate(pd_graph(), POLICIES)
    assert [v.policy for v in violations] == ["paid-gpu-utilisation"]  # 3 TP1 replicas a zone on an 8-GPU p4de


def test_every_efa_rule_is_in_the_pack_and_has_a_missing_part() -> None:
    assert {p.name for p in EFA_POLICIES} <= {p.name for p in POLICIES}
    assert set(MISSING) == {p.name for p in EFA_POLICIES}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_a_graph_missing_its_part_trips_exactly_that_rule(name: str) -> None:
    change, apply = MISSING[name]
    graph = apply(pd_graph())
    assert graph != pd_graph(), change
    assert _tripped(graph) == {name}
    violations = [v for v in evaluate(graph, EFA_POLICIES) if v.policy == name]
    assert all(v.mandatory and "Risk:" in v.message and "qwen-7b" in v.message for v in violations)


@pytest.mark.parametrize("case", sorted(ALSO_MISSING))
def test_other_ways_to_lose_a_part_trip_its_rule(case: str) -> None:
    name, apply = ALSO_MISSING[case]
    assert name in _tripped(apply(pd_graph()))


@pytest.mark.parametrize("stack", ["prod", "staging", "dev"])
def test_stacks_without_a_pd_pool_never_trip_the_efa_rules(stack: str) -> None:
    assert _tripped(list(stack_run(stack).resources)) == set()


def test_a_capacity_block_group_launches_without_a_placement_group_and_passes() -> None:
    # A Capacity Block's reservation fixes where its instances run: no placement group to name (`infra.efa_cloud`).
    document = stack_document("aws", **PD_OVERRIDES, **{"gpuNodeGroups.0.capacityType": "capacity-block"})
    graph = list(offline_run(document, "prod").resources)
    assert not [r for r in graph if r.type == "aws:ec2/placementGroup:PlacementGroup"]
    assert _tripped(graph) == set()


@pytest.mark.parametrize(("port", "trips"), [(5600, False), (8001, True), (8000, True)])
def test_engines_may_reach_engines_only_on_a_port_that_is_none_of_their_own(port: int, trips: bool) -> None:
    def change(props: dict[str, Any]) -> None:
        for rule in props["spec"]["ingress"]:
            if rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "engine"}}}]:
                rule["ports"] = [{"protocol": "TCP", "port": port}]

    graph = edit("kubernetes:networking.k8s.io/v1:NetworkPolicy", change, lambda r: r.name.endswith("engine-ingress"))(
        pd_graph()
    )
    assert ("network-default-deny" in {v.policy for v in evaluate(graph, POLICIES)}) is trips
