"""Block hashes with and without a ``cache_salt``, against numbers computed by vLLM 0.32's own code, and the
simulator's prefix cache and KV events partitioned by salt as vLLM's are."""

from __future__ import annotations

import pytest

from engine_sim.block_hash import chain_hashes, external_hash, extra_keys, none_hash
from engine_sim.errors import RequestError
from engine_sim.kv_events import KVEventsConfig, KVEventSettings
from engine_sim.protocol import cache_salt_of
from tests.engine_sim.builders import make_request, make_scheduler, run_until_idle

# Tokens 0..31 in 16-token blocks, sha256, published ints (low 64 bits) of blocks 1 and 2. Computed with
# .build/vllm/venv (vLLM 0.32.0): init_none_hash(sha256); k = generate_block_hash_extra_keys(request, 0, 16, 0)
# for a request with no LoRA, no multimodal input and cache_salt None or "tenant-a"; hash_block_tokens(sha256,
# parent, tokens, k). The seed is $PYTHONHASHSEED ("0": run with PYTHONHASHSEED=0), or vLLM's "vllm-none-hash"
# when it is unset. vLLM gave k = (("cache_salt", "tenant-a"),) for block 0, None for block 1, and
# to_event_extra_keys -> [("tenant-a",), None].
VECTORS = {
    ("0", None): [7982712666671721126, 12675106281628537544],
    ("0", "tenant-a"): [7890639415391687430, 10096775062482375148],
    ("vllm-none-hash", None): [3262291359910021016, 7142137847444424233],
    ("vllm-none-hash", "tenant-a"): [12616911002861201973, 7015185682589215122],
}
EVENTS_ON = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))


@pytest.mark.parametrize(("seed", "salt"), sorted(VECTORS, key=str), ids=str)
def test_block_hashes_match_vllms_with_and_without_a_salt(seed: str, salt: str | None) -> None:
    digests = chain_hashes(none_hash(seed), list(range(32)), 16, [], salt)
    assert [external_hash(d) for d in digests] == VECTORS[(seed, salt)]


def test_the_salt_is_an_extra_key_of_the_first_block_only() -> None:
    assert extra_keys(0, "tenant-a") == (("cache_salt", "tenant-a"),)
    assert extra_keys(1, "tenant-a") is None
    assert extra_keys(0, None) is None


def _prefill(sched, prompt: list[int], salt: str | None) -> int:  # type: ignore[no-untyped-def]
    request = make_request(prompt, max_tokens=1, cache_salt=salt)
    sched.add(request, now=0.0)
    run_until_idle(sched)
    return request.num_cached_tokens


def test_the_prefix_cache_is_shared_within_a_salt_and_never_across() -> None:
    sched = make_scheduler()
    prompt = list(range(64))
    assert _prefill(sched, prompt, "tenant-a") == 0
    assert _prefill(sched, prompt, "tenant-b") == 0  # another salt: a miss, though the tokens are the same
    assert _prefill(sched, prompt, None) == 0  # no salt is a partition of its own
    assert _prefill(sched, prompt, "tenant-a") == 48  # the same salt hits (the last block is always recomputed)


def test_salted_blocks_are_published_with_vllms_hashes_and_extra_keys() -> None:
    sched = make_scheduler(kv_events=EVENTS_ON)
    log = sched.kv.pool.events
    assert log is not None
    _prefill(sched, list(range(33)), "tenant-a")
    (stored,) = log.take()
    assert stored["block_hashes"] == VECTORS[("vllm-none-hash", "tenant-a")]
    assert stored["parent_block_hash"] is None
    assert stored["extra_keys"] == [["tenant-a"], None]  # untagged, on block 0 only, as to_event_extra_keys


def test_unsalted_blocks_carry_null_extra_keys() -> None:
    sched = make_scheduler(kv_events=EVENTS_ON)
    log = sched.kv.pool.events
    assert log is not None
    _prefill(sched, list(range(33)), None)
    (stored,) = log.take()
    assert stored["extra_keys"] == [None, None]


@pytest.mark.parametrize("salt", ["a/b", "x@y", "back\\slash", "nul\x00", "a" * 129, "", 7])
def test_a_salt_vllm_refuses_is_a_400_naming_it(salt: object) -> None:
    with pytest.raises(RequestError) as info:
        cache_salt_of({"cache_salt": salt})
    assert info.value.status == 400 and info.value.param == "cache_salt"


def test_a_salt_vllm_accepts_passes() -> None:
    assert cache_salt_of({"cache_salt": "a" * 128}) == "a" * 128
    assert cache_salt_of({}) is None
