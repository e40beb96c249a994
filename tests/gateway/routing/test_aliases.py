"""Aliases: the weighted choice keeps its shares, sticks to a session, moves few sessions, and falls back in order."""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import pytest

from fleet.spec.stack import AliasSpec
from gateway.routing.aliases import AliasTable, WeightedAlias
from tests.gateway.builders import request

SESSIONS = 2000
CANARY = {"qwen-v1": 95, "qwen-v2": 5}


def _always(pool: str) -> bool:
    del pool  # Unused.
    return True


def _chosen(alias: WeightedAlias, sessions: int = SESSIONS) -> dict[str, str]:
    """Session id -> the pool its first request goes to, every pool ready."""
    table = AliasTable({alias.name: alias})
    return {
        sid: table.resolve(alias, request(request_id=f"r-{sid}", session_id=sid), _always)
        for sid in (f"session-{i}" for i in range(sessions))
    }


@pytest.mark.parametrize(
    "weights",
    [CANARY, {"a": 50, "b": 50}, {"a": 70, "b": 20, "c": 10}, {"a": 1, "b": 99}],
    ids=["95-5", "50-50", "70-20-10", "1-99"],
)
def test_each_pool_gets_its_share_of_sessions_within_three_sigma(weights: Mapping[str, int]) -> None:
    counts = collections.Counter(_chosen(WeightedAlias("chat", weights)).values())
    total = sum(weights.values())
    for pool, weight in weights.items():
        share = weight / total
        mean, sigma = SESSIONS * share, math.sqrt(SESSIONS * share * (1 - share))
        assert abs(counts[pool] - mean) <= 3 * sigma, (pool, counts[pool], mean, sigma)


def test_the_five_percent_canary_gets_100_sessions_give_or_take_29() -> None:
    canary = collections.Counter(_chosen(WeightedAlias("chat", CANARY)).values())["qwen-v2"]
    assert 100 - 3 * math.sqrt(2000 * 0.05 * 0.95) <= canary <= 100 + 3 * math.sqrt(2000 * 0.05 * 0.95)


def test_a_session_always_gets_the_same_pool_from_any_table_and_any_turn() -> None:
    alias = WeightedAlias("chat", {"a": 40, "b": 30, "c": 30})
    replica = AliasTable.from_spec({"chat": AliasSpec(pools={"a": 40, "b": 30, "c": 30})})  # another gateway's
    for i in range(200):
        sid = f"conversation-{i}"
        turns = [request(request_id=f"{sid}-turn-{t}", session_id=sid, prompt="hello " * t) for t in range(4)]
        chosen = {AliasTable({"chat": alias}).resolve(alias, info, _always) for info in turns}
        chosen |= {replica.resolve(replica.aliases["chat"], info, _always) for info in turns}
        assert len(chosen) == 1, (sid, chosen)


def test_without_a_session_header_a_conversation_keys_on_its_leading_prompt_blocks() -> None:
    alias = WeightedAlias("chat", {"a": 50, "b": 50})
    table = AliasTable({"chat": alias})
    for i in range(50):
        opening = f"Conversation {i}. " + "Tell me about the sea. " * 60  # over four 256-character blocks
        turns = [request(request_id=f"c{i}-{t}", prompt=opening + " and then?" * t) for t in range(3)]
        assert len({table.resolve(alias, info, _always) for info in turns}) == 1


def test_sticky_none_chooses_per_request() -> None:
    alias = WeightedAlias("chat", {"a": 50, "b": 50}, sticky=False)
    table = AliasTable({"chat": alias})
    chosen = collections.Counter(
        table.resolve(alias, request(request_id=f"r{i}", session_id="one-session"), _always) for i in range(400)
    )
    assert set(chosen) == {"a", "b"}
    assert abs(chosen["a"] - 200) <= 3 * math.sqrt(400 * 0.25)


def test_raising_the_canary_weight_moves_sessions_only_onto_the_canary() -> None:
    before = _chosen(WeightedAlias("chat", CANARY))
    after = _chosen(WeightedAlias("chat", {"qwen-v1": 90, "qwen-v2": 10}))
    moved = {sid: (before[sid], after[sid]) for sid in before if before[sid] != after[sid]}
    assert set(moved.values()) == {("qwen-v1", "qwen-v2")}  # none left the canary, none went anywhere else
    # Only the sessions it must: the canary's share grows by 5 points, so about 100 of 2,000 move.
    assert abs(len(moved) - 100) <= 3 * math.sqrt(2000 * 0.05 * 0.95)


def test_turning_a_pool_off_moves_only_its_own_sessions() -> None:
    before = _chosen(WeightedAlias("chat", {"a": 40, "b": 30, "c": 30}))
    after = _chosen(WeightedAlias("chat", {"a": 40, "b": 30, "c": 0}))
    assert "c" not in after.values()
    assert all(after[sid] == pool for sid, pool in before.items() if pool != "c")


@pytest.mark.parametrize(
    ("down", "expected"),
    [
        (set(), "qwen-v2"),  # the choice
        ({"qwen-v2"}, "qwen-small"),  # the fallback
        ({"qwen-v2", "qwen-small"}, "qwen-v1"),  # the other weighted pools
        ({"qwen-v2", "qwen-small", "qwen-v1"}, "qwen-v2"),  # none ready: the choice, for the usual 503
    ],
    ids=["chosen", "fallback", "other-weighted", "none-ready"],
)
def test_a_pool_without_a_ready_replica_falls_back_in_order(down: set[str], expected: str) -> None:
    alias = WeightedAlias("chat", CANARY, fallback="qwen-small")
    table = AliasTable({"chat": alias})
    canary_sessions = [sid for sid, pool in _chosen(alias, 400).items() if pool == "qwen-v2"]
    assert canary_sessions
    for sid in canary_sessions:
        info = request(request_id=f"r-{sid}", session_id=sid)
        assert table.resolve(alias, info, lambda pool: pool not in down) == expected


def test_a_zero_weight_pool_is_never_a_candidate() -> None:
    alias = WeightedAlias("chat", {"a": 1, "off": 0}, fallback="spare")
    assert all(alias.candidates(bytes([i]) * 16) == ["a", "spare"] for i in range(50))


@pytest.mark.parametrize(
    ("weights", "fallback", "message"),
    [
        ({"a": 0, "b": 0}, None, "sum to 0"),
        ({"a": -1, "b": 2}, None, "non-negative integers"),
        ({"a": 1.5}, None, "non-negative integers"),
        ({"a": True}, None, "non-negative integers"),
        ({"a": 1}, "a", "one of its weighted pools"),
    ],
    ids=["zero-sum", "negative", "fraction", "bool", "fallback-among-pools"],
)
def test_an_invalid_alias_is_refused(weights: dict[str, int], fallback: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightedAlias("chat", weights, fallback)


def test_the_table_is_immutable() -> None:
    table = AliasTable.from_spec({"chat": AliasSpec(pools={"a": 1}, fallback="b", sticky="none")})
    alias = table.aliases["chat"]
    assert (alias.pools, alias.sticky) == (["a", "b"], False)
    with pytest.raises(TypeError):
        alias.weights["a"] = 5  # type: ignore[index]
    with pytest.raises(TypeError):
        table.aliases["other"] = alias  # type: ignore[index]
