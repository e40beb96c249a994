"""p2c's affinity anchor: the preferred replica is always drawn, within a load bound; table-driven."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import pytest

from gateway.routing import pickers
from gateway.routing.base import SCORERS, EndpointView, RequestInfo, Router, Scored, anchor, within_bound
from gateway.routing.scorers.kv_cache import KvCache
from tests.gateway.builders import P2C_SESSION_ROUTING, endpoint, request
from tests.support import stacks

PICKS = 2000


def _scored(rid: str, score: float, affinity: float = 0.0, **load: float) -> Scored:
    return Scored(endpoint(rid, **load), score, affinity)


HOT = [_scored("s", 9, 5, in_flight=12), _scored("b", 3, in_flight=2), _scored("c", 3, in_flight=1)]


def _counts(candidates: Sequence[Scored], load_factor: float = 1.25) -> collections.Counter[str]:
    picker = pickers.REGISTRY.create("p2c", {"seed": 3, "loadFactor": load_factor})
    return collections.Counter(picker.pick(candidates, request()).id for _ in range(PICKS))


@pytest.mark.parametrize(
    ("candidates", "load_factor", "always", "never"),
    [
        # Five replicas: plain p2c would pick "s" only when drawn (2 in 5); anchored, it is always a candidate.
        ([_scored("s", 8, 5), *(_scored(x, 3) for x in "bcde")], 1.25, "s", None),
        # A tie with the other draw goes to the anchor (it holds the cached state).
        ([_scored("s", 3, 1), _scored("b", 3), _scored("c", 3)], 1.25, "s", None),
        # The highest affinity is the anchor, not merely any replica with some affinity.
        ([_scored("p", 4, 1), _scored("s", 8, 5), _scored("c", 3), _scored("d", 3)], 1.25, "s", "p"),
        # The anchor is drawn but a clearly better replica still wins the comparison.
        ([_scored("s", 1, 1), _scored("b", 3), _scored("c", 3)], 1.25, None, "s"),
        # Over the bound (12 > 1.25 x mean 5 + 1): left out of both draws, whatever its affinity.
        (
            [_scored("s", 9, 5, in_flight=12), _scored("b", 3, in_flight=2), _scored("c", 3, in_flight=1)],
            1.25,
            None,
            "s",
        ),
        # A looser bound keeps it (12 <= 3 x 5 + 1).
        (
            [_scored("s", 9, 5, in_flight=12), _scored("b", 3, in_flight=2), _scored("c", 3, in_flight=1)],
            3.0,
            "s",
            None,
        ),
        # Engine gauges count too: other gateways' requests queue on the same replica.
        ([_scored("s", 9, 5, running=8, waiting=30), _scored("b", 3, running=8), _scored("c", 3)], 1.25, None, "s"),
        # A nearly idle fleet whose gauges still show the session's previous request stays sticky.
        ([_scored("s", 9, 5, running=1), _scored("b", 3), _scored("c", 3), _scored("d", 3)], 1.25, "s", None),
        # No affinity anywhere: plain p2c, the worst replica is never picked.
        ([_scored("busy", 0), _scored("b", 1), _scored("c", 0.9)], 1.25, None, "busy"),
    ],
    ids=[
        "anchor-always-drawn",
        "tie-goes-to-anchor",
        "highest-affinity-is-anchor",
        "anchor-loses-to-better-score",
        "anchor-over-bound-skipped",
        "looser-bound-keeps-anchor",
        "engine-queue-counts-as-load",
        "idle-fleet-stale-gauge-slack",
        "no-affinity-plain-p2c",
    ],
)
def test_p2c_anchor_table(candidates: list[Scored], load_factor: float, always: str | None, never: str | None) -> None:
    counts = _counts(candidates, load_factor)
    if always is not None:
        assert counts[always] == PICKS, counts
    if never is not None:
        assert counts[never] == 0, counts
        assert sum(counts.values()) == PICKS


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        ([_scored("a", 1), _scored("b", 2)], None),
        ([_scored("a", 1, 0.5), _scored("b", 2)], "a"),
        ([_scored("a", 6, 5), _scored("b", 7, 1)], "a"),
        ([_scored("a", 6, 5), _scored("b", 7, 5)], "b"),  # equal affinity: the higher total
    ],
    ids=["none", "only-positive", "highest-affinity", "tie-higher-score"],
)
def test_anchor_is_the_highest_positive_affinity(candidates: list[Scored], expected: str | None) -> None:
    found = anchor(candidates)
    assert (found.endpoint.id if found else None) == expected


@pytest.mark.parametrize(
    ("loads", "load_factor", "expected"),
    [
        ([0, 0, 0, 0], 1.25, True),
        ([5, 3, 3, 3], 1.25, True),  # 5 <= 1.25 x 3.5 + 1
        ([6, 3, 3, 3], 1.25, False),  # 6 > 1.25 x 3.75 + 1
        ([6, 3, 3, 3], 1.5, True),
        ([1, 0, 0, 0], 1.0, True),  # the +1 slack
        ([2, 0, 0, 0], 1.0, False),
    ],
)
def test_within_bound_compares_the_anchor_with_the_mean_load(
    loads: list[int], load_factor: float, expected: bool
) -> None:
    candidates = [_scored(str(i), 0, in_flight=n) for i, n in enumerate(loads)]
    assert within_bound(candidates[0], candidates, load_factor) is expected


@pytest.mark.parametrize(
    ("spared", "expected"),
    [
        (0.0, False),  # 9 > 1.25 x 4.5 + 1 = 6.6
        (0.3, False),  # 9 > 6.6 x 1.3 = 8.6
        (0.5, True),  # 9 <= 6.6 x 1.5 = 9.9: half its prefill spared, it takes the request
        (1.0, True),
    ],
)
def test_the_bound_grows_with_the_share_of_prefill_the_anchors_cache_spares(spared: float, expected: bool) -> None:
    candidates = [Scored(endpoint("a", in_flight=9), 1.0, 1.0, spared)]
    candidates += [Scored(endpoint(x, in_flight=3), 1.0) for x in "bcd"]
    assert within_bound(candidates[0], candidates, 1.25) is expected


def test_the_router_keeps_the_largest_prefill_share_spared_unweighted() -> None:
    class Holds(KvCache, name="test-holds"):  # a kv-cache whose index says "a" holds 80%, "b" 40%
        def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
            return [{"a": 0.8, "b": 0.4}[e.id] for e in endpoints]

    try:
        router = Router([], [(Holds(), 3.0)], pickers.REGISTRY.create("max-score", {"seed": 1}))
        seen: list[Sequence[Scored]] = []
        original = router.picker.pick
        router.picker.pick = lambda c, r: seen.append(c) or original(c, r)  # type: ignore[method-assign]
        router.route([endpoint("a"), endpoint("b")], request())
    finally:
        SCORERS.unregister("test-holds")
    assert [(c.affinity, c.spared) for c in seen[0]] == [(pytest.approx(2.4), 0.8), (pytest.approx(1.2), 0.4)]


def _session_router(seed: int) -> Router:
    routing = stacks.spec("prod", **{"gateway.routing": P2C_SESSION_ROUTING}).gateway.routing
    picker = routing.picker.model_copy(update={"params": {**routing.picker.params, "seed": seed}})
    return Router.from_refs(routing.filters, routing.scorers, picker)


def _route(router: Router, endpoints: list[EndpointView], session: str | None, i: int) -> str:
    decision = router.route(endpoints, request(request_id=f"{session}-{i}", session_id=session, prompt="Hi there."))
    assert decision is not None
    return decision.endpoint.id


def test_session_routing_keeps_each_session_on_one_replica_until_it_leaves() -> None:
    router = _session_router(seed=11)
    endpoints = [endpoint(x, kv_usage=0.1 * i) for i, x in enumerate("abcd")]
    sessions = [f"user-{i}" for i in range(60)]
    before = {s: {_route(router, endpoints, s, i) for i in range(10)} for s in sessions}
    assert all(len(replicas) == 1 for replicas in before.values()), before
    assert set().union(*before.values()) == set("abcd")  # sessions spread over every replica
    remaining = [e for e in endpoints if e.id != "b"]
    after = {s: {_route(router, remaining, s, i) for i in range(10, 20)} for s in sessions}
    assert all(len(replicas) == 1 for replicas in after.values()), after
    assert {s for s in sessions if after[s] != before[s]} == {s for s in sessions if before[s] == {"b"}}


def test_session_routing_without_a_session_spreads_load() -> None:
    router = _session_router(seed=5)
    endpoints = [endpoint(x) for x in "abcd"]
    counts = collections.Counter(_route(router, endpoints, None, i) for i in range(400))
    assert set(counts) == set("abcd") and min(counts.values()) > 50, counts
