"""The kv-cache scorer: each replica's share of the prompt's leading blocks, as its engine reported them."""

from __future__ import annotations

from gateway.routing.scorers.kv_cache import KvCache
from tests.gateway.builders import endpoint, request
from tests.gateway.routing.test_kv_index import stored

TOKENS = tuple(range(64))  # four full blocks
ENDPOINTS = [endpoint("r1"), endpoint("r2")]


def test_a_replica_scores_its_reported_share_of_the_prompts_leading_blocks() -> None:
    scorer = KvCache()
    scorer.index.apply("r2", [stored([1, 2], None, list(TOKENS[:32]))])
    assert list(scorer.score(ENDPOINTS, request(token_ids=TOKENS))) == [0.0, 0.5]
    assert list(scorer.score(ENDPOINTS, request(request_id="no-tokens"))) == [0.0, 0.0]


def test_a_share_below_min_share_scores_zero_and_the_load_scorers_decide() -> None:
    scorer = KvCache()
    scorer.index.apply("r1", [stored([1, 2, 3], None, list(TOKENS[:48]))])
    scorer.index.apply("r2", [stored([4], None, list(TOKENS[:16]))])
    assert list(scorer.score(ENDPOINTS, request(request_id="a", token_ids=TOKENS))) == [0.75, 0.0]  # 0.25 < 0.5
    anything = KvCache(KvCache.Params(min_share=0.0))
    anything.index.apply("r2", [stored([4], None, list(TOKENS[:16]))])
    assert list(anything.score(ENDPOINTS, request(request_id="b", token_ids=TOKENS))) == [0.0, 0.25]


def test_a_forgotten_replica_and_one_whose_stream_is_cut_score_zero() -> None:
    scorer = KvCache(KvCache.Params(min_share=0.0))
    scorer.index.apply("r1", [stored([1, 2], None, list(TOKENS[:32]))])
    scorer.index.apply("r2", [stored([3], None, list(TOKENS[:16]))])
    scorer.index.forget("r1")
    assert list(scorer.score(ENDPOINTS, request(request_id="a", token_ids=TOKENS))) == [0.0, 0.25]
    scorer.stream_down.add("r2")
    assert list(scorer.score(ENDPOINTS, request(request_id="b", token_ids=TOKENS))) == [0.0, 0.0]


def test_the_hit_rate_counts_the_blocks_the_chosen_replica_held() -> None:
    scorer = KvCache()
    scorer.index.apply("r1", [stored([1, 2, 3], None, list(TOKENS[:48]))])
    info = request(request_id="a", token_ids=TOKENS)
    scorer.score(ENDPOINTS, info)
    scorer.observe(info, ENDPOINTS[1])  # the picker chose the one without the prefix (load)
    other = request(request_id="b", token_ids=TOKENS)
    scorer.observe(other, ENDPOINTS[0])  # a single candidate: observe without score
    assert (scorer.hit_blocks, scorer.prompt_blocks) == (3, 8) and scorer.hit_rate() == 3 / 8


def test_by_default_the_block_size_is_learned_and_until_then_every_replica_scores_zero() -> None:
    scorer = KvCache()
    tokens = tuple(range(300))  # two full blocks of 128 (vLLM's CPU build)
    assert list(scorer.score(ENDPOINTS, request(request_id="a", token_ids=tokens))) == [0.0, 0.0]
    scorer.index.apply("r1", [stored([1, 2], None, list(tokens[:256]), block_size=128)])
    assert list(scorer.score(ENDPOINTS, request(request_id="b", token_ids=tokens))) == [1.0, 0.0]


def test_a_pinned_block_size_indexes_nothing_of_another_size() -> None:
    scorer = KvCache(KvCache.Params(block_size=16))
    tokens = tuple(range(300))
    scorer.index.apply("r1", [stored([1, 2], None, list(tokens[:256]), block_size=128)])
    assert list(scorer.score(ENDPOINTS, request(token_ids=tokens))) == [0.0, 0.0]
    assert scorer.index.skipped["block_size"] == 2
