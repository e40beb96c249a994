"""KV events from a real simulator process, read with plain ``zmq`` and ``msgpack`` as a consumer of vLLM 0.33 reads
them: three-frame messages from seq 0, the replay socket, and ``AllBlocksCleared`` after a reset or a sleep."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from engine_sim.tokenizer_build import DEFAULT_OUT
from fleet.protocol.ports import free_port
from fleet.tokenizer import load_tokenizer
from tests.engine_sim.conftest import SpawnSim
from tests.support.procs import Proc

pytestmark = pytest.mark.slow

TOPIC = b"kv@sim@qwen"
PROMPT = list(range(40))  # blocks 1-2 full after the prefill; decoding 9 more tokens fills block 3
VECTOR = [3262291359910021016, 7142137847444424233]  # tokens 0..31 under vLLM 0.33's default sha256 scheme
END = (-1).to_bytes(8, "big", signed=True)
Batch = tuple[bytes, int, list[Any]]


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def subscriber(context: zmq.Context[zmq.Socket[bytes]]) -> Iterator[tuple[zmq.Socket[bytes], int]]:
    """A SUB socket bound on loopback (as llm-d's indexer binds), subscribed to the topic; and its port."""
    with context.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        yield sub, sub.bind_to_random_port("tcp://127.0.0.1")
        sub.setsockopt(zmq.LINGER, 0)


def _spawn(
    spawn_sim: SpawnSim,
    monkeypatch: pytest.MonkeyPatch,
    sub: zmq.Socket[bytes],
    pub_port: int,
    replay_port: int,
    *flags: str,
) -> Proc:
    """A simulator whose PUB connects to ``sub`` on ``pub_port`` and whose replay ROUTER binds ``replay_port``."""
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # the test vector is for vLLM's default seed
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": TOPIC.decode(),
    }
    sim = spawn_sim(
        "--startup-seconds",
        "0",
        "--time-scale",
        "20",
        "--enable-sleep-mode",
        "--kv-events-config",
        json.dumps(config),
        *flags,
    )
    sim.wait_http("/health", timeout_s=20)
    # libzmq attaches a peer that connected to a bound socket only when the socket's owner next uses it, and only
    # then sends the subscription: like a real consumer, be receiving before the first batch (a PUB without the
    # subscription drops it).
    assert not sub.poll(500)
    return sim


def _complete(sim: Proc, max_tokens: int) -> None:
    response = sim.post(
        "/v1/completions", json={"model": "qwen", "prompt": PROMPT, "max_tokens": max_tokens}, timeout=30
    )
    assert response.status_code == 200, response.text


def _receive(sub: zmq.Socket[bytes], timeout_s: float = 10.0) -> Batch:
    """The next message as (topic, seq, decoded batch); AssertionError when none comes within ``timeout_s``."""
    if not sub.poll(int(timeout_s * 1000)):
        raise AssertionError(f"no KV-event batch within {timeout_s} s")
    topic, seq, payload = sub.recv_multipart()
    assert len(seq) == 8
    return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)


def _types(batch: list[Any]) -> list[str]:
    return [event["type"] for event in batch[1]]


def test_a_completion_publishes_its_full_blocks_from_seq_0_and_the_replay_returns_them(
    spawn_sim: SpawnSim,
    monkeypatch: pytest.MonkeyPatch,
    subscriber: tuple[zmq.Socket[bytes], int],
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    sub, pub_port = subscriber
    replay_port = free_port()
    sim = _spawn(spawn_sim, monkeypatch, sub, pub_port, replay_port)
    _complete(sim, max_tokens=12)
    first, second = _receive(sub), _receive(sub)
    assert [(first[0], first[1]), (second[0], second[1])] == [(TOPIC, 0), (TOPIC, 1)]
    ts, events, rank = first[2]
    assert abs(ts - time.time()) < 30 and rank == 0
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": VECTOR,
            "parent_block_hash": None,
            "token_ids": list(range(32)),
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None, None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ]
    (third_block,) = second[2][1]
    assert third_block["parent_block_hash"] == VECTOR[1] and third_block["token_ids"][:8] == PROMPT[32:]

    with context.socket(zmq.DEALER) as replay:
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(f"tcp://127.0.0.1:{replay_port}")
        for start, seqs in ((0, [0, 1]), (1, [1])):
            replay.send_multipart([b"", start.to_bytes(8, "big")])
            replies = [_reply(replay) for _ in range(len(seqs) + 1)]
            assert [(topic, seq) for topic, seq, _ in replies[:-1]] == [(TOPIC, s.to_bytes(8, "big")) for s in seqs]
            assert [msgpack.unpackb(payload) for _, _, payload in replies[:-1]] == [first[2], second[2]][-len(seqs) :]
            assert replies[-1] == (b"", END, b"")


def _reply(replay: zmq.Socket[bytes]) -> tuple[bytes, bytes, bytes]:
    if not replay.poll(10_000):
        raise AssertionError("no replay reply within 10 s")
    empty, topic, seq, payload = replay.recv_multipart()
    assert empty == b""
    return topic, seq, payload


def test_a_prefix_cache_reset_and_a_sleep_clear_all_blocks_with_the_next_steps_batch(
    spawn_sim: SpawnSim, monkeypatch: pytest.MonkeyPatch, subscriber: tuple[zmq.Socket[bytes], int]
) -> None:
    sub, pub_port = subscriber
    sim = _spawn(spawn_sim, monkeypatch, sub, pub_port, free_port())
    _complete(sim, max_tokens=1)
    assert _types(_receive(sub)[2]) == ["BlockStored"]

    assert sim.post("/reset_prefix_cache").json() == {"success": True}
    assert not sub.poll(300)  # an idle engine publishes nothing, as vLLM's
    _complete(sim, max_tokens=1)
    _, seq, batch = _receive(sub)
    assert seq == 1 and _types(batch) == ["AllBlocksCleared", "BlockStored"]
    assert batch[1][1]["block_hashes"] == VECTOR  # stored again: the reset forgot them

    assert sim.post("/sleep?level=1", timeout=30).status_code == 200
    assert sim.post("/wake_up", timeout=30).json()["status"] == "awake"
    _complete(sim, max_tokens=1)
    _, seq, batch = _receive(sub)
    assert seq == 2 and _types(batch) == ["AllBlocksCleared", "BlockStored"]


def test_with_a_tokenizer_folder_a_chats_blocks_carry_the_ids_a_gateway_computes_from_it(
    spawn_sim: SpawnSim, monkeypatch: pytest.MonkeyPatch, subscriber: tuple[zmq.Socket[bytes], int]
) -> None:
    sub, pub_port = subscriber
    sim = _spawn(spawn_sim, monkeypatch, sub, pub_port, free_port(), "--tokenizer", str(DEFAULT_OUT))
    messages = [{"role": "user", "content": "Which engine holds the warm cache for this prompt? " * 4}]
    response = sim.post("/v1/chat/completions", json={"model": "qwen", "messages": messages, "max_tokens": 1})
    assert response.status_code == 200, response.text
    ids = load_tokenizer(DEFAULT_OUT).chat_ids(messages)
    assert response.json()["usage"]["prompt_tokens"] == len(ids)
    _, seq, batch = _receive(sub)
    stored = [t for event in batch[1] if event["type"] == "BlockStored" for t in event["token_ids"]]
    assert seq == 0 and len(stored) >= 32 and stored == ids[: len(ids) // 16 * 16]
