"""The routing plugins and the runner, table-driven over endpoint snapshots."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator, Sequence

import pytest

from fleet.spec.plugins import PluginParams, Registry
from fleet.spec.stack import PluginRef
from gateway.routing import filters, pickers, scorers
from gateway.routing.base import (
    FILTERS,
    SCORERS,
    EndpointView,
    Filter,
    RequestInfo,
    Router,
    Scored,
    Scorer,
)
from tests.gateway.builders import endpoint, request


@pytest.mark.parametrize(
    ("name", "params", "endpoints", "expected"),
    [
        ("ready", {}, [endpoint("a"), endpoint("b", ready=False)], ["a"]),
        ("not-ejected", {}, [endpoint("a", ejected=True), endpoint("b")], ["b"]),
        ("serves-model", {}, [endpoint("a", model="other"), endpoint("b")], ["b"]),
        ("fresh-metrics", {"maxAgeS": 1}, [endpoint("a", metrics_age_s=3), endpoint("b")], ["b"]),
        ("fresh-metrics", {}, [endpoint("a", metrics_age_s=None), endpoint("b", metrics_age_s=9)], ["a", "b"]),
    ],
    ids=["ready", "not-ejected", "serves-model", "fresh-metrics", "fresh-metrics-fails-open"],
)
def test_filter_keeps_expected_endpoints(
    name: str, params: dict[str, float], endpoints: list[EndpointView], expected: list[str]
) -> None:
    plugin = filters.REGISTRY.create(name, params)
    assert [e.id for e in plugin.filter(endpoints, request())] == expected


@pytest.mark.parametrize(
    ("name", "endpoints", "expected"),
    [
        ("queue-depth", [endpoint("a", waiting=4), endpoint("b", waiting=0), endpoint("c", waiting=2)], [0, 1, 0.5]),
        ("queue-depth", [endpoint("a"), endpoint("b")], [1, 1]),
        ("queue-depth", [endpoint("a", in_flight=12), endpoint("b", waiting=2)], [0, 1]),  # 12 - 8 seqs = 4 queued
        ("kv-usage", [endpoint("a", kv_usage=0.25), endpoint("b", kv_usage=1.0)], [0.75, 0]),
        ("in-flight", [endpoint("a", in_flight=3), endpoint("b", running=1, waiting=1), endpoint("c")], [0, 1 / 3, 1]),
    ],
    ids=["queue-spread", "queue-equal", "queue-from-in-flight", "kv", "in-flight"],
)
def test_load_scorer_values(name: str, endpoints: list[EndpointView], expected: list[float]) -> None:
    plugin = scorers.REGISTRY.create(name)
    assert list(plugin.score(endpoints, request())) == pytest.approx(expected)


def test_prefix_affinity_prefers_the_replica_that_served_the_prefix() -> None:
    plugin = scorers.REGISTRY.create("prefix-affinity", {"blockChars": 4})
    eps = [endpoint("a"), endpoint("b")]
    first = request(request_id="1", prompt="aaaabbbbcccc")
    assert list(plugin.score(eps, first)) == [0, 0]
    plugin.observe(first, eps[1])
    same_start = request(request_id="2", prompt="aaaabbbbzzzz")
    assert list(plugin.score(eps, same_start)) == pytest.approx([0, 2 / 3])


def test_prefix_affinity_index_is_bounded() -> None:
    plugin = scorers.REGISTRY.create("prefix-affinity", {"blockChars": 1, "maxBlocks": 8, "capacity": 50})
    for i in range(100):
        plugin.observe(request(request_id=str(i), prompt=f"{i:08d}"), endpoint("a"))
    assert len(plugin) == 50


def test_session_affinity_is_sticky_and_moves_only_when_its_replica_leaves() -> None:
    plugin = scorers.session.SessionAffinity()
    eps = [endpoint(x) for x in "abcd"]
    owners = {s: plugin.owner(eps, s) for s in (f"user-{i}" for i in range(200))}
    assert len(set(owners.values())) == 4  # sessions spread over every replica
    assert all(plugin.owner(eps, s) == o for s, o in owners.items())  # and stay put
    gone = "b"
    remaining = [e for e in eps if e.id != gone]
    moved = {s for s, o in owners.items() if plugin.owner(remaining, s) != o}
    assert moved == {s for s, o in owners.items() if o == gone}


def test_session_affinity_bounds_load() -> None:
    plugin = scorers.session.SessionAffinity(scorers.session.SessionAffinity.Params(load_factor=1.25))
    eps = [endpoint("a"), endpoint("b")]
    owner = plugin.owner(eps, "s")
    loaded = [endpoint(e.id, in_flight=10 if e.id == owner else 0) for e in eps]
    assert plugin.owner(loaded, "s") != owner
    assert list(plugin.score(eps, request(session_id=None))) == [0, 0]


def _counts(picker_name: str, candidates: Sequence[Scored], n: int = 3000) -> collections.Counter[str]:
    picker = pickers.REGISTRY.create(picker_name, {"seed": 1})
    return collections.Counter(picker.pick(candidates, request()).id for _ in range(n))


def test_p2c_avoids_the_worst_endpoint_and_random_does_not() -> None:
    candidates = [Scored(endpoint("busy"), 0.0), Scored(endpoint("b"), 1.0), Scored(endpoint("c"), 0.9)]
    assert _counts("p2c", candidates)["busy"] == 0
    assert 800 < _counts("random", candidates)["busy"] < 1200


def test_max_score_breaks_ties_at_random_and_round_robin_cycles() -> None:
    tied = [Scored(endpoint("a"), 1.0), Scored(endpoint("b"), 1.0), Scored(endpoint("c"), 0.2)]
    counts = _counts("max-score", tied)
    assert counts["c"] == 0 and counts["a"] > 1000 and counts["b"] > 1000
    assert set(_counts("round-robin", tied, n=300).values()) == {100}


@pytest.fixture
def test_plugins() -> Iterator[None]:
    """Registers two plugins for the runner test and removes them again (registries are process-wide)."""

    class Constant(Scorer, name="test-constant"):
        class Params(PluginParams):
            value: float = 0.0

        def __init__(self, params: Params | None = None) -> None:
            self.value = (params or self.Params()).value

        def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
            return [self.value if i == 0 else 0.5 for i, _ in enumerate(endpoints)]

    class Nothing(Filter, name="test-nothing"):
        def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
            return []

    yield
    SCORERS.unregister("test-constant")
    FILTERS.unregister("test-nothing")


@pytest.mark.usefixtures("test_plugins")
def test_router_clamps_weights_and_times_plugins() -> None:
    timings: list[str] = []
    router = Router.from_refs(
        [PluginRef(name="ready")],
        [PluginRef(name="test-constant", weight=2, params={"value": 7.0})],
        PluginRef(name="max-score"),
        on_timing=lambda name, seconds: timings.append(name),
    )
    decision = router.route([endpoint("a"), endpoint("b"), endpoint("c", ready=False)], request())
    assert decision is not None
    assert (decision.endpoint.id, decision.candidates, decision.score) == ("a", 2, 2.0)  # 7 clamped to 1, x2
    assert timings == ["ready", "test-constant", "max-score"]
    empty = Router.from_refs([PluginRef(name="test-nothing")], [], PluginRef(name="p2c"))
    assert empty.route([endpoint("a")], request()) is None


@pytest.mark.parametrize(
    ("registry", "name", "params", "message"),
    [
        (filters.REGISTRY, "helthy", {}, "registered: fresh-metrics, not-ejected, ready, serves-adapter, serves-model"),
        (pickers.REGISTRY, "p2c", {"k": 3}, "params.k: unknown key; allowed keys: loadFactor, seed"),
        (
            scorers.REGISTRY,
            "prefix-affinity",
            {"capacity": 0},
            "params.capacity: Input should be greater than or equal to 1",
        ),
    ],
)
def test_bad_plugin_config_fails_listing_valid_choices(
    registry: Registry[object], name: str, params: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.create(name, params)
