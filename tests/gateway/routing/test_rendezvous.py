"""rendezvous-affinity: the same snapshot and request give the same replica on any gateway, within a load bound."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from fleet.spec.stack import PluginRef
from gateway.routing import scorers
from gateway.routing.base import EndpointView, RequestInfo, Router
from gateway.routing.scorers.rendezvous import RendezvousAffinity, affinity_key, rendezvous_order, winner
from tests.gateway.builders import endpoint, request

IDS = [f"qwen-7b-{i}" for i in range(5)]
BLOCK = 16
PARAMS = RendezvousAffinity.Params(block_chars=BLOCK, key_blocks=2)


def _key(text: str) -> bytes:
    key = affinity_key(request(prompt=text), BLOCK, 2)
    assert key is not None
    return key


def _conversation(i: int) -> str:
    return f"conversation {i:04d} ".ljust(2 * BLOCK, ".")


def test_order_is_pinned_across_processes_and_versions() -> None:
    # blake2b of the key and the replica id, never Python's per-process salted hash(): every gateway, in every
    # process and release, must rank replicas alike, or a rolling update splits conversations between replicas.
    assert rendezvous_order(b"conversation", IDS) == ["qwen-7b-1", "qwen-7b-2", "qwen-7b-4", "qwen-7b-0", "qwen-7b-3"]


def test_same_snapshot_and_request_give_the_same_replica_whatever_the_order_and_instance() -> None:
    eps = [endpoint(rid, in_flight=i % 3) for i, rid in enumerate(IDS)]
    rng = random.Random(5)
    for i in range(200):
        info = request(request_id=str(i), prompt=_conversation(i))
        chosen = set()
        for _ in range(4):  # four gateways, each listing the replicas in its own order
            shuffled = rng.sample(eps, len(eps))
            values = RendezvousAffinity(PARAMS).score(shuffled, info)
            chosen.add(next(e.id for e, v in zip(shuffled, values, strict=True) if v == 1.0))
        assert len(chosen) == 1, (i, chosen)


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (request(prompt="a" * 40), request(prompt="a" * 40 + " and the next turn"), True),  # later turns keep the key
        (request(prompt="a" * 32 + "x"), request(prompt="a" * 32 + "y"), True),  # only the first key blocks count
        (request(prompt="a" * 16 + "b" * 16), request(prompt="a" * 16 + "c" * 16), False),
        (request(prompt="a" * 40, session_id="s1"), request(prompt="z" * 40, session_id="s1"), True),  # session wins
        (request(prompt="a" * 40, session_id="s1"), request(prompt="a" * 40, session_id="s2"), False),
    ],
    ids=["turns", "past-key-blocks", "different-prefix", "session-over-prompt", "two-sessions"],
)
def test_affinity_key(first: RequestInfo, second: RequestInfo, same: bool) -> None:
    assert (affinity_key(first, BLOCK, 2) == affinity_key(second, BLOCK, 2)) is same


def test_a_prompt_shorter_than_a_block_has_no_affinity() -> None:
    plugin = RendezvousAffinity(PARAMS)
    assert list(plugin.score([endpoint(rid) for rid in IDS], request(prompt="short"))) == [0.0] * len(IDS)


def test_scores_decay_in_rendezvous_order_and_skip_replicas_over_the_bound() -> None:
    key = _key("x" * 32)
    order = rendezvous_order(key, IDS)
    busy = order[1]  # second in order: over the bound, so the third comes next
    eps = [endpoint(rid, in_flight=8 if rid == busy else 1) for rid in IDS]  # bound 1.25 x 12 / 5 + 1 = 4
    values = dict(zip(IDS, RendezvousAffinity(PARAMS).score(eps, request(prompt="x" * 32)), strict=True))
    assert [values[rid] for rid in order] == pytest.approx([1.0, 0.0, 0.25, 0.0625, 0.015625])


@pytest.mark.parametrize(
    ("winner_load", "others", "moves"),
    [
        ({"in_flight": 2}, {"in_flight": 1}, False),  # 2 <= 1.25 x 6 / 5 + 1 = 2.5
        ({"in_flight": 6}, {"in_flight": 1}, True),  # 6 > 1.25 x 10 / 5 + 1 = 3.5
        ({"running": 5, "waiting": 3}, {}, True),  # the engine's running + waiting count too: 8 > 3
        ({"in_flight": 1}, {}, False),  # a gauge still counting the previous request: 1 <= 1.25 x 0.2 + 1
    ],
    ids=["slightly-above-mean", "overloaded", "engine-gauges", "nearly-idle"],
)
def test_an_overloaded_winner_is_skipped_for_the_next_in_order(
    winner_load: dict[str, Any], others: dict[str, Any], moves: bool
) -> None:
    key = _key("y" * 32)
    first, second = rendezvous_order(key, IDS)[:2]
    eps = [endpoint(rid, **(winner_load if rid == first else others)) for rid in IDS]
    assert winner(eps, key, load_factor=1.25) == (second if moves else first)


def test_removing_a_replica_moves_only_its_keys_and_adding_one_takes_a_fair_share() -> None:
    keys = [_key(_conversation(i)) for i in range(2000)]
    eps = [endpoint(rid) for rid in IDS]
    before = {k: winner(eps, k, 1.25) for k in keys}
    assert all(250 < n < 550 for n in collections.Counter(before.values()).values())  # ~400 each

    gone = IDS[2]
    after = {k: winner([e for e in eps if e.id != gone], k, 1.25) for k in keys}
    assert {k for k in keys if after[k] != before[k]} == {k for k in keys if before[k] == gone}

    grown = {k: winner([*eps, endpoint("qwen-7b-new")], k, 1.25) for k in keys}
    moved = [k for k in keys if grown[k] != before[k]]
    assert all(grown[k] == "qwen-7b-new" for k in moved) and 200 < len(moved) < 470  # ~1/6 of 2000


def _router(seed: int, picker: str) -> Router:
    return Router.from_refs(
        [PluginRef(name="ready")],
        [
            PluginRef(name="queue-depth", weight=2),
            PluginRef(name="kv-usage", weight=1),
            PluginRef(name="rendezvous-affinity", weight=5, params={"blockChars": BLOCK, "keyBlocks": 2}),
        ],
        PluginRef(name=picker, params={"seed": seed}),
    )


@pytest.mark.parametrize("picker", ["p2c", "max-score"])
def test_gateways_with_different_draws_route_a_conversation_alike(picker: str) -> None:
    # Load differs between replicas (within the bound): the load scorers disagree with the affinity, yet with
    # weight 5 x (1 - 0.25) > 2 + 1 the winner keeps every decision on every gateway.
    rng = random.Random(11)
    eps: list[EndpointView] = [
        endpoint(rid, waiting=rng.choice([0, 1]), kv_usage=rng.random(), in_flight=rng.choice([0, 1])) for rid in IDS
    ]
    gateways = [_router(seed, picker) for seed in range(4)]
    for i in range(100):
        info = request(request_id=str(i), prompt=_conversation(i))
        chosen = set()
        for gateway in gateways:
            for _ in range(3):
                decision = gateway.route(rng.sample(eps, len(eps)), info)
                assert decision is not None
                chosen.add(decision.endpoint.id)
        assert chosen == {winner(eps, _key(_conversation(i)), 1.25)}, i


def test_registered_with_typed_params() -> None:
    plugin = scorers.REGISTRY.create("rendezvous-affinity", {"blockChars": 8, "keyBlocks": 3, "decay": 0.5})
    assert isinstance(plugin, RendezvousAffinity) and plugin.affinity
    with pytest.raises(ValueError, match="decay"):
        scorers.REGISTRY.create("rendezvous-affinity", {"decay": 1.0})
