"""KV events in process: vLLM 0.33's block hashes, ``--kv-events-config`` parsing, the events the KV cache records,
and the batch bytes as plain msgpack decodes them (the layout of docs/engine-simulator.md, "KV-cache events")."""

from __future__ import annotations

import argparse
from typing import Any

import msgpack
import pytest

from engine_sim.block_hash import chain_hashes, external_hash, none_hash
from engine_sim.cli import add_arguments
from engine_sim.engine import Engine
from engine_sim.kv_events import KVEventLog, KVEventsConfig, KVEventSettings, encode_batch
from engine_sim.kv_publisher import binds
from engine_sim.scheduler import Scheduler
from tests.engine_sim.builders import make_config, make_request, make_scheduler, run_until_idle

# Tokens 0..31 in 16-token blocks: the published ints of blocks 1 and 2 under vLLM 0.33's sha256 scheme.
VECTOR = {
    "vllm-none-hash": ("066b1e89", [3262291359910021016, 7142137847444424233]),
    "42": ("c0bc02c9", [12181739546299357825, 7267745021275738674]),
}
EVENTS_ON = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))


@pytest.mark.parametrize("seed", sorted(VECTOR))
def test_block_hashes_reproduce_vllm_033s_sha256_test_vector(seed: str) -> None:
    root_prefix, published = VECTOR[seed]
    root = none_hash(seed)
    digests = chain_hashes(root, list(range(32)), 16, [])
    assert root.hex().startswith(root_prefix)
    assert [external_hash(d) for d in digests] == published
    assert external_hash(digests[0], as_int=False) == digests[0]  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0


def test_a_partial_block_is_not_hashed() -> None:
    assert len(chain_hashes(none_hash(), list(range(31)), 16, [])) == 1


# -- --kv-events-config --------------------------------------------------------------------------------------


def _parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["serve", "m", *flags])


def test_the_config_has_vllms_fields_and_defaults() -> None:
    assert _parse().kv_events_config is None
    off = _parse("--kv-events-config", "{}").kv_events_config
    assert off.model_dump() == {
        "enable_kv_cache_events": False,
        "publisher": "null",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": None,
        "buffer_steps": 10_000,
        "hwm": 100_000,
        "max_queue_size": 100_000,
        "topic": "",
    }
    on = _parse("--kv-events-config", '{"enable_kv_cache_events": true, "topic": "kv@a@m"}').kv_events_config
    assert (on.publisher, on.topic, on.publishes) == ("zmq", "kv@a@m", True)
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").publishes


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"enable_kv_cache_events": true, "bufer_steps": 5}', "bufer_steps"),
        ('{"enable_kv_cache_events": true', "JSON"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"hwm": "many"}', "hwm"),
        ("[1]", "KVEventsConfig"),
    ],
)
def test_a_bad_config_exits_2_naming_the_flag(value: str, named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse("--kv-events-config", value)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kv-events-config" in err and named in err


@pytest.mark.parametrize(
    ("endpoint", "bind"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://indexer:5557", False),
    ],
)
def test_the_pub_socket_binds_or_connects_by_vllms_rule(endpoint: str, bind: bool) -> None:
    assert binds(endpoint) is bind


# -- what the KV cache records -------------------------------------------------------------------------------


def _sched(**overrides: Any) -> tuple[Scheduler, KVEventLog]:
    sched = make_scheduler(kv_events=EVENTS_ON, **overrides)
    log = sched.kv.pool.events
    assert log is not None
    return sched, log


def _run(sched: Scheduler, prompt: list[int], max_tokens: int = 1) -> None:
    sched.add(make_request(prompt, max_tokens=max_tokens), now=0.0)
    run_until_idle(sched)


def test_no_log_without_the_flag_or_with_the_null_publisher() -> None:
    assert make_scheduler().kv.pool.events is None
    null = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    assert make_scheduler(kv_events=null).kv.pool.events is None


def test_a_prompts_full_blocks_are_stored_with_their_tokens_and_chained_parents() -> None:
    sched, log = _sched()
    _run(sched, list(range(40)), max_tokens=12)  # prefill stores blocks 1-2; decoding fills block 3
    first, second = log.take()
    assert first == {
        "type": "BlockStored",
        "block_hashes": VECTOR["vllm-none-hash"][1],
        "parent_block_hash": None,
        "token_ids": list(range(32)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],  # vLLM publishes the list with a null per unsalted block
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",  # set by vLLM's KV-cache manager on stored blocks
    }
    assert second["parent_block_hash"] == VECTOR["vllm-none-hash"][1][1]
    assert second["token_ids"][:8] == list(range(32, 40)) and len(second["token_ids"]) == 16
    assert log.take() == []


def test_a_cache_hit_stores_only_the_new_blocks() -> None:
    sched, log = _sched()
    _run(sched, list(range(32)) + [7] * 5)
    log.take()
    _run(sched, list(range(32)) + [9] * 20)  # blocks 1-2 hit; block 3 is new
    (event,) = log.take()
    assert event["parent_block_hash"] == VECTOR["vllm-none-hash"][1][1]
    assert event["token_ids"] == [9] * 16


def test_an_eviction_removes_an_announced_block_and_a_reset_clears_all() -> None:
    sched, log = _sched(num_gpu_blocks_override=4, max_model_len=64)
    _run(sched, list(range(20)))  # stores block 1 (of 2 used)
    (stored,) = log.take()
    _run(sched, list(range(100, 163)))  # needs all 4 blocks: block 1 of the first prompt is evicted
    events = log.take()
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert removed == [
        {"type": "BlockRemoved", "block_hashes": stored["block_hashes"], "medium": "GPU", "group_idx": 0}
    ]
    sched.kv.pool.reset_prefix_cache()
    assert log.take() == [{"type": "AllBlocksCleared"}]


def test_a_block_evicted_after_a_reset_is_not_removed_again() -> None:
    sched, log = _sched(num_gpu_blocks_override=4, max_model_len=64)
    _run(sched, list(range(20)))
    sched.kv.pool.reset_prefix_cache()
    log.take()
    _run(sched, list(range(100, 163)))
    assert [e["type"] for e in log.take()] == ["BlockStored"]


def test_the_batch_is_the_array_ts_events_rank_of_map_events() -> None:
    events = [{"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "GPU", "group_idx": 0}]
    decoded = msgpack.unpackb(encode_batch(1.5, [*events, {"type": "AllBlocksCleared"}]))
    assert decoded == [1.5, [*events, {"type": "AllBlocksCleared"}], 0]


def test_the_reset_route_refuses_while_a_request_holds_blocks() -> None:
    engine = Engine(make_config(kv_events=EVENTS_ON))
    engine.submit(make_request(40))
    engine.scheduler.step(0.0)  # prefilled, not finished: its blocks are held
    assert engine.try_reset_prefix_cache() is False
    engine.abort_all()
    assert engine.try_reset_prefix_cache() is True
