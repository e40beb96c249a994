"""least-work: the candidate where a request adds the least work in prompt tokens, its cached share spared."""

from __future__ import annotations

import collections

import pytest

from fleet.spec.plugins import BadParams
from gateway.routing import pickers
from gateway.routing.base import Scored
from gateway.routing.pickers.least_work import work
from tests.gateway.builders import endpoint, request

PROMPT = tuple(range(4000))


def _scored(rid: str, spared: float = 0.0, **load: int) -> Scored:
    return Scored(endpoint(rid, **load), score=0.0, affinity=spared, spared=spared)


def _picks(candidates: list[Scored], tokens: tuple[int, ...] = PROMPT, **params: float) -> collections.Counter[str]:
    picker = pickers.REGISTRY.create("least-work", {"seed": 5, **params})
    info = request(token_ids=tokens)
    return collections.Counter(picker.pick(candidates, info).id for _ in range(400))


def test_work_is_queued_prefill_plus_the_uncached_prompt_plus_weighted_decode_context() -> None:
    candidate = _scored("a", spared=0.75, prefill_tokens=500, context_tokens=20_000)
    assert work(candidate, 4000, 0.1) == 500 + 1000 + 2000


@pytest.mark.parametrize(
    ("candidates", "chosen"),
    [
        # The holder of the prompt is cheapest while its queued prefill is shorter than the prompt.
        ([_scored("hold", 1.0, prefill_tokens=3000), _scored("cold")], "hold"),
        # Past that, the cold replica is cheaper: prefilling there beats waiting behind the holder's queue.
        ([_scored("hold", 1.0, prefill_tokens=5000), _scored("cold")], "cold"),
        # A half-held prompt against an idle replica: 2,000 + 1,000 queued < 4,000.
        ([_scored("half", 0.5, prefill_tokens=1000), _scored("cold")], "half"),
        # Without any cache: the least queued prefill, whatever the request counts.
        ([_scored("a", prefill_tokens=9000, in_flight=1), _scored("b", prefill_tokens=100, in_flight=6)], "b"),
        # Decoding contexts weigh a tenth of a prompt token each: 30,000 of them outweigh 2,000 queued.
        ([_scored("a", context_tokens=30_000), _scored("b", prefill_tokens=2000)], "b"),
    ],
)
def test_the_cheapest_candidate_is_always_chosen(candidates: list[Scored], chosen: str) -> None:
    assert _picks(candidates) == {chosen: 400}


def test_the_decode_weight_sets_what_a_decoding_context_costs() -> None:
    candidates = [_scored("a", context_tokens=30_000), _scored("b", prefill_tokens=2000)]
    assert _picks(candidates, decodeWeight=0.0) == {"a": 400}
    assert _picks(candidates, decodeWeight=0.1) == {"b": 400}


def test_equal_costs_are_shared_evenly_and_a_request_without_tokens_goes_by_queued_work() -> None:
    idle = [_scored(x) for x in "abcd"]
    counts = _picks(idle)
    assert set(counts) == set("abcd") and min(counts.values()) > 60
    # no token ids: the cached share cannot count, only the queued prefill does
    assert _picks([_scored("hold", 1.0, prefill_tokens=10), _scored("cold")], tokens=()) == {"cold": 400}


def test_a_decode_weight_out_of_range_fails_at_config_load_naming_the_limit() -> None:
    with pytest.raises(BadParams, match="decodeWeight"):
        pickers.REGISTRY.create("least-work", {"decodeWeight": -1})


def test_a_prompt_without_token_ids_counts_its_estimate() -> None:
    assert request(token_ids=PROMPT, estimated_tokens=10).prompt_tokens == 4000
    assert request(token_ids=None, estimated_tokens=900).prompt_tokens == 900
