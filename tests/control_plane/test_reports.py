"""Registries: staleness by arrival time and forgetting the long-silent, the same for replicas and gateways; the
replica registry also forgets the stopped and answers discovery."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.plane import ControlPlane
from control_plane.reports import GatewayRegistry, ReplicaRegistry, ReportRegistry
from fleet.spec.errors import SpecError
from tests.control_plane.builders import gateway_report, report
from tests.control_plane.conftest import Clock
from tests.support import stacks


@pytest.mark.parametrize(
    ("case", "state", "age", "listed", "stale"),
    [
        ("fresh", "ready", 1.0, True, False),
        ("just past the limit", "ready", 5.5, True, True),
        ("stopped, recent", "stopped", 1.0, True, False),
        ("stopped, old: forgotten", "stopped", 6.0, False, None),
        ("silent for 20x the limit: forgotten", "ready", 101.0, False, None),
    ],
)
def test_staleness_table(case: str, state: str, age: float, listed: bool, stale: bool | None) -> None:
    registry = ReplicaRegistry(stale_after_s=5.0)
    registry.record(report("a", state=state, ts=0.0), now=100.0)
    seen = registry.seen("qwen-7b", now=100.0 + age)
    assert bool(seen) == listed, case
    if listed:
        assert seen[0].stale is stale, case


def test_the_agent_clock_does_not_matter_only_arrival_does() -> None:
    registry = ReplicaRegistry(stale_after_s=5.0)
    registry.record(report("skewed", ts=-10_000.0), now=100.0)  # an agent whose clock is hours behind
    [seen] = registry.seen("qwen-7b", now=101.0)
    assert not seen.stale


def test_discovery_hides_stopped_replicas_and_keeps_draining_ones() -> None:
    registry = ReplicaRegistry(stale_after_s=5.0)
    for name, state in (("a", "ready"), ("b", "draining"), ("c", "stopped")):
        registry.record(report(name, state=state), now=100.0)
    listing = registry.replica_list("qwen-7b", "m", now=100.5)
    assert [(r.replica, r.state) for r in listing.replicas] == [("a", "ready"), ("b", "draining")]


def _registry(kind: str) -> tuple[ReportRegistry[Any], Any, Any]:
    """A registry of ``kind`` and reports from its reporters "a" and "b" about pool qwen-7b."""
    if kind == "replicas":
        return ReplicaRegistry(stale_after_s=5.0), report("a", ts=0.0), report("b", ts=0.0)
    return GatewayRegistry(stale_after_s=5.0), gateway_report("a", ts=0.0), gateway_report("b", ts=0.0)


@pytest.mark.parametrize(
    ("case", "age", "listed", "stale"),
    [
        ("fresh", 1.0, True, False),
        ("stale", 5.5, True, True),
        ("at 20x the limit: still listed", 100.0, True, True),
        ("past 20x the limit: forgotten", 100.5, False, None),
    ],
)
@pytest.mark.parametrize("kind", ["replicas", "gateways"])
def test_replicas_and_gateways_share_the_staleness_rules(
    kind: str, case: str, age: float, listed: bool, stale: bool | None
) -> None:
    registry, first, _ = _registry(kind)
    registry.record(first, now=100.0)
    seen = registry.seen("qwen-7b", now=100.0 + age)
    assert [s.stale for s in seen] == ([stale] if listed else []), case
    assert registry.pools() == ({"qwen-7b"} if listed else set()), case


@pytest.mark.parametrize("kind", ["replicas", "gateways"])
def test_reports_are_kept_per_pool_and_reporter_and_a_newer_one_replaces_the_older(kind: str) -> None:
    registry, first, second = _registry(kind)
    registry.record(first, now=100.0)
    registry.record(second, now=101.0)
    registry.record(first, now=102.0)
    assert [(s.received_at, s.age_s) for s in registry.seen("qwen-7b", now=103.0)] == [(102.0, 1.0), (101.0, 2.0)]
    assert registry.seen("other-pool", now=103.0) == []
    registry.forget("qwen-7b", "a")
    assert [s.received_at for s in registry.seen("qwen-7b", now=103.0)] == [101.0]


def test_a_stopped_replica_is_forgotten_once_stale_while_a_stale_gateway_stays_listed() -> None:
    replicas = ReplicaRegistry(stale_after_s=5.0)
    replicas.record(report("a", state="stopped"), now=100.0)
    assert replicas.seen("qwen-7b", now=106.0) == []
    gateways = GatewayRegistry(stale_after_s=5.0)
    gateways.record(gateway_report("a", waiting=0), now=100.0)
    assert [s.stale for s in gateways.seen("qwen-7b", now=106.0)] == [True]


@pytest.mark.parametrize(
    ("settings", "forget_s"),
    [
        ({}, 15.0),  # staleAfterS 5 + 10 report intervals of 1 s
        ({"controlPlane.reportIntervalS": 0.25, "controlPlane.staleAfterS": 2}, 4.5),
        ({"controlPlane.forgetAfterS": 30}, 30.0),
    ],
)
def test_a_dead_replica_leaves_the_replica_list_on_the_spec_timer(settings: dict[str, Any], forget_s: float) -> None:
    spec = stacks.spec("local", **settings)
    assert spec.control_plane.forget_after == forget_s
    cp = ControlPlane.build(spec, Clock(0.0))
    for registry, sent in ((cp.registry, report("a", ts=0.0)), (cp.gateways, gateway_report("a", ts=0.0))):
        registry.record(sent, now=100.0)  # type: ignore[arg-type]
        assert [s.stale for s in registry.seen("qwen-7b", now=100.0 + forget_s)] == [True]  # listed, stale
        assert registry.seen("qwen-7b", now=100.0 + forget_s + 0.01) == []  # then gone
    cp.registry.record(report("b", ts=0.0), now=100.0)
    assert cp.registry.replica_list("qwen-7b", "m", now=100.0 + forget_s + 0.01).replicas == []


def test_forget_after_must_exceed_the_stale_limit() -> None:
    with pytest.raises(SpecError, match="forgetAfterS 5 must be more than staleAfterS 5"):
        stacks.spec("local", **{"controlPlane.forgetAfterS": 5})
