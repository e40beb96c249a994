"""The gateway's KV index: fed the simulator's own KV events (the bytes vLLM 0.33's layout gives, decoded as the
feed decodes them), it knows which replica holds which prompt prefix, and forgets what the engines say they
dropped."""

from __future__ import annotations

from typing import Any

import pytest

from engine_sim.kv_events import KVEventsConfig, KVEventSettings, encode_batch
from engine_sim.scheduler import Scheduler
from gateway.kv_events import decode_batch
from gateway.routing.kv_index import SKIP_REASONS, KvIndex, request_keys
from tests.engine_sim.builders import make_request, make_scheduler, run_until_idle

EVENTS_ON = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))


class Engine:
    """One simulated engine whose KV events reach ``index`` as ``replica``'s, through the wire encoding."""

    def __init__(self, index: KvIndex, replica: str, **overrides: Any) -> None:
        self.sched: Scheduler = make_scheduler(kv_events=EVENTS_ON, **overrides)
        self.index, self.replica = index, replica

    def serve(self, prompt: list[int]) -> None:
        self.sched.add(make_request(prompt, max_tokens=1), now=0.0)
        run_until_idle(self.sched)
        self.publish()

    def publish(self) -> None:
        log = self.sched.kv.pool.events
        assert log is not None
        self.index.apply(self.replica, decode_batch(encode_batch(1.0, log.take())))


def stored(hashes: list[int], parent: int | None, tokens: list[int], **extra: Any) -> dict[str, Any]:
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens}
    return {**event, "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, **extra}


PROMPT = list(range(1000, 1070))  # 4 full blocks and 6 tokens


def test_the_replica_that_served_a_prompt_holds_its_full_blocks_and_no_other_does() -> None:
    index = KvIndex()
    Engine(index, "a").serve(PROMPT)
    keys = request_keys(PROMPT, 16)
    assert len(keys) == 4
    assert index.matched(keys, ["a", "b"]) == {"a": 4, "b": 0}


def test_a_prompt_sharing_only_a_prefix_matches_only_the_shared_leading_blocks() -> None:
    index = KvIndex()
    Engine(index, "a").serve(PROMPT)
    other = PROMPT[:40] + [7] * 40  # blocks 1-2 shared, block 3 differs
    assert index.matched(request_keys(other, 16), ["a"]) == {"a": 2}
    assert index.matched(request_keys([5] + PROMPT, 16), ["a"]) == {"a": 0}  # shifted: nothing is a prefix


def test_a_hit_on_a_second_engine_extends_the_chain_from_the_blocks_it_already_announced() -> None:
    index = KvIndex()
    engine = Engine(index, "b")
    engine.serve(PROMPT[:32] + [1, 2])
    engine.serve(PROMPT)  # blocks 1-2 are hits (not announced again); 3-4 are stored under block 2
    assert index.matched(request_keys(PROMPT, 16), ["b"]) == {"b": 4}


def test_an_evicted_block_cuts_the_prefix_at_it_and_a_reset_clears_the_replica() -> None:
    index = KvIndex()
    engine = Engine(index, "a", num_gpu_blocks_override=5, max_model_len=80)
    engine.serve(PROMPT)
    engine.serve(list(range(5000, 5079)))  # needs all 5 blocks: the first prompt's blocks are evicted
    assert index.matched(request_keys(PROMPT, 16), ["a"]) == {"a": 0}
    assert index.blocks_of("a") == 4
    engine.sched.kv.pool.reset_prefix_cache()
    engine.publish()
    assert index.blocks_of("a") == 0 and len(index) == 0 and index.replicas() == frozenset()


def test_blocks_are_held_per_replica_and_forgetting_one_keeps_the_others() -> None:
    index = KvIndex()
    Engine(index, "a").serve(PROMPT)
    Engine(index, "b").serve(PROMPT)
    keys = request_keys(PROMPT, 16)
    assert index.matched(keys, ["a", "b"]) == {"a": 4, "b": 4}
    index.forget("a")
    assert index.matched(keys, ["a", "b"]) == {"a": 0, "b": 4}
    assert len(index) == 4


def test_the_engines_hash_values_do_not_matter_only_their_links() -> None:
    index = KvIndex()
    tokens = list(range(32))
    index.apply("a", [stored([111], None, tokens[:16]), stored([222], 111, tokens[16:])])
    index.apply("b", [stored([9, 8], None, tokens)])  # another hash scheme, same tokens
    assert index.matched(request_keys(tokens, 16), ["a", "b"]) == {"a": 2, "b": 2}
    index.apply("a", [{"type": "BlockRemoved", "block_hashes": [111], "medium": "GPU"}])
    assert index.matched(request_keys(tokens, 16), ["a", "b"]) == {"a": 0, "b": 2}


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        pytest.param(stored([1], 999, list(range(16))), "parent", id="parent never announced"),
        pytest.param(stored([1], None, list(range(16)), medium="CPU"), "medium", id="offloaded"),
        pytest.param(stored([1], None, list(range(32)), block_size=32), "block_size", id="another block size"),
        pytest.param(stored([1, 2], None, list(range(16))), "malformed", id="tokens do not fill the blocks"),
        pytest.param(stored([], None, [], block_size=0), "malformed", id="block size 0"),
    ],
)
def test_blocks_the_index_cannot_vouch_for_are_skipped_and_counted_by_reason(
    event: dict[str, Any], reason: str
) -> None:
    index = KvIndex(block_size=16)
    index.apply("a", [event])
    assert len(index) == 0
    assert index.skipped == {**dict.fromkeys(SKIP_REASONS, 0), reason: len(event["block_hashes"])}


def test_the_block_size_is_learned_from_the_events_and_prompts_are_cut_in_it() -> None:
    # vLLM's CPU build caches blocks of 128 tokens (and refuses 16); the GPU build's default is 16.
    index = KvIndex()
    assert index.block_size is None and not index.pinned
    tokens = list(range(384))
    index.apply("a", [stored([1, 2, 3], None, tokens, block_size=128)])
    assert index.block_size == 128 and index.blocks_of("a") == 3
    assert index.matched(request_keys(tokens + [7] * 100, 128), ["a"]) == {"a": 3}
    assert sum(index.skipped.values()) == 0


def test_a_pinned_block_size_skips_the_events_of_another_size_under_reason_block_size() -> None:
    index = KvIndex(block_size=16)
    index.apply("a", [stored([1, 2, 3], None, list(range(384)), block_size=128)])
    assert index.block_size == 16 and index.pinned and len(index) == 0
    assert index.skipped["block_size"] == 3 and index.reported == {"a": 128}


def test_a_replica_reporting_another_size_is_skipped_while_the_first_sizes_blocks_are_held() -> None:
    index = KvIndex()
    tokens = list(range(256))
    index.apply("a", [stored([1, 2], None, tokens, block_size=128)])
    index.apply("b", [stored([5] * 16, None, tokens, block_size=16)])  # a misconfigured replica of the same pool
    assert (index.block_size, index.blocks_of("b"), index.skipped["block_size"]) == (128, 0, 16)
    # Once nothing is held (the first replicas left: a pool redeployed with another --block-size), it is relearned.
    index.forget("a")
    index.apply("b", [stored(list(range(16)), None, tokens, block_size=16)])
    assert index.block_size == 16 and index.matched(request_keys(tokens, 16), ["b"]) == {"b": 16}


def test_an_adapters_blocks_do_not_match_the_base_models_prompt() -> None:
    index = KvIndex()
    tokens = list(range(16))
    index.apply("a", [stored([1], None, tokens, lora_name="sql-lora")])
    assert index.matched(request_keys(tokens, 16), ["a"]) == {"a": 0}
    assert index.matched(request_keys(tokens, 16, "sql-lora"), ["a"]) == {"a": 1}


def test_unknown_event_types_are_ignored_and_a_malformed_stored_raises() -> None:
    index = KvIndex()
    index.apply("a", [{"type": "SomethingNew"}])
    with pytest.raises(KeyError):
        index.apply("a", [{"type": "BlockStored"}])
