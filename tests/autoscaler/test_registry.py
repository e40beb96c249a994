"""ReplicaRegistry: staleness by arrival time, forgetting the long-silent and the stopped."""

from __future__ import annotations

import pytest

from autoscaler.registry import ReplicaRegistry
from tests.autoscaler.builders import report


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
