"""The KV index with cache salts: a chain stored under a salt (vLLM's ``extra_keys`` of its first block) matches
only requests sent with that salt, so a tenant's repeated prefix still finds its holder and another tenant's does
not; fed the simulator's own salted events through the wire encoding."""

from __future__ import annotations

from typing import Any

import pytest

from engine_sim.kv_events import KVEventsConfig, KVEventSettings, encode_batch
from gateway.kv_events import decode_batch
from gateway.routing.kv_index import KvIndex, event_salt, request_keys
from tests.engine_sim.builders import make_request, make_scheduler, run_until_idle

EVENTS_ON = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))
PROMPT = list(range(1000, 1070))  # 4 full blocks and 6 tokens


def _serve(index: KvIndex, replica: str, salt: str | None, prompt: list[int] = PROMPT) -> None:
    sched = make_scheduler(kv_events=EVENTS_ON)
    sched.add(make_request(prompt, max_tokens=1, cache_salt=salt), now=0.0)
    run_until_idle(sched)
    log = sched.kv.pool.events
    assert log is not None
    index.apply(replica, decode_batch(encode_batch(1.0, log.take())))


def test_a_salted_prefix_matches_only_requests_with_its_salt() -> None:
    index = KvIndex()
    _serve(index, "a", "salt-a")
    _serve(index, "b", "salt-b")
    _serve(index, "c", None)
    assert index.matched(request_keys(PROMPT, 16, None, "salt-a"), "abc") == {"a": 4, "b": 0, "c": 0}
    assert index.matched(request_keys(PROMPT, 16, None, "salt-b"), "abc") == {"a": 0, "b": 4, "c": 0}
    assert index.matched(request_keys(PROMPT, 16), "abc") == {"a": 0, "b": 0, "c": 4}
    assert index.matched(request_keys(PROMPT, 16, None, "salt-z"), "abc") == {"a": 0, "b": 0, "c": 0}


def test_a_later_block_of_a_salted_chain_inherits_its_salt_through_the_parent() -> None:
    index = KvIndex()
    sched = make_scheduler(kv_events=EVENTS_ON)
    sched.add(make_request(PROMPT[:40], max_tokens=30, cache_salt="salt-a"), now=0.0)  # decoding fills block 3
    run_until_idle(sched)
    log = sched.kv.pool.events
    assert log is not None
    first, *later = log.take()
    assert first["extra_keys"] == [["salt-a"], None] and all(e.get("parent_block_hash") for e in later)
    index.apply("a", decode_batch(encode_batch(1.0, [first, *later])))
    assert index.matched(request_keys(PROMPT[:40], 16, None, "salt-a"), "a") == {"a": 2}


@pytest.mark.parametrize(
    ("event", "salt"),
    [
        ({"extra_keys": [["s"], None]}, "s"),
        ({"extra_keys": [None, None]}, None),
        ({}, None),
        ({"extra_keys": None}, None),
        ({"lora_name": "ad", "extra_keys": [["ad", "s"], ["ad"]]}, "s"),  # the LoRA name comes first
        ({"lora_name": "ad", "extra_keys": [["ad"], ["ad"]]}, None),
        ({"extra_keys": [[["mm-hash", 0], "s"]]}, "s"),  # multimodal pairs come before the salt
    ],
)
def test_the_salt_is_the_first_bare_string_of_block_0s_extra_keys_after_the_lora_name(
    event: dict[str, Any], salt: str | None
) -> None:
    assert event_salt(event) == salt
