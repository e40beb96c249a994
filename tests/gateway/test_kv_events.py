"""The KV event feed on loopback: a real ZMQ PUB socket sends vLLM's three frames, the gateway's feed applies them
to its kv-cache scorer's index, drops a replica's entries on a gap, a restart or a lost connection, and the scorer
then leaves that replica to the load scorers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from gateway.kv_events import KvEventFeed, KvFeedCollector
from gateway.routing.kv_index import request_keys
from gateway.routing.scorers.kv_cache import KvCache
from tests.gateway.builders import endpoint, request
from tests.gateway.routing.test_kv_index import stored

TOKENS = list(range(48))  # three full blocks


def batch(*events: dict[str, Any]) -> bytes:
    return msgpack.packb([1.0, list(events), 0])


class Publisher:
    """A replica's PUB socket, as the engine binds it, with vLLM's frames."""

    def __init__(self, context: zmq.asyncio.Context, topic: str = "kv@r1@m") -> None:
        self.socket = context.socket(zmq.PUB)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.topic = topic.encode()

    async def send(self, seq: int, payload: bytes, topic: bytes | None = None) -> None:
        await self.socket.send_multipart([topic or self.topic, seq.to_bytes(8, "big"), payload])


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@dataclass
class Stream:
    """The feed following replica r1's publisher, connected: ``seq`` is the next seq to send."""

    pub: Publisher
    scorer: KvCache
    feed: KvEventFeed
    seq: int = 0


async def connect(stream: Stream, timeout_s: float = 5.0) -> None:
    """Send probe batches (one block each) until one is indexed: a SUB socket misses what was sent before it
    joined."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while "r1" in stream.scorer.stream_down or stream.scorer.index.blocks_of("r1") == 0:
        assert asyncio.get_running_loop().time() < deadline, "the feed never connected"
        await stream.pub.send(stream.seq, batch(stored([stream.seq + 10_000], None, [99] * 16)))
        stream.seq += 1
        await asyncio.sleep(0.02)


@pytest.fixture
async def stream() -> AsyncIterator[Stream]:
    context = zmq.asyncio.Context()
    scorer = KvCache()
    feed = KvEventFeed({"p": [scorer]}, context)
    pub = Publisher(context)
    feed.sync("p", {"r1": f"tcp://127.0.0.1:{pub.port}"})
    connected = Stream(pub, scorer, feed)
    await connect(connected)
    yield connected
    await feed.close()
    pub.socket.close(linger=0)
    context.destroy(linger=0)


def keys() -> list[int]:
    return request_keys(TOKENS, 16)


def series(feed: KvEventFeed, name: str) -> dict[tuple[str, ...], float]:
    """The collector's samples of ``name`` by their label values."""
    collected = [s for m in KvFeedCollector(feed).collect() for s in m.samples if s.name == name]
    return {tuple(s.labels.values()): s.value for s in collected}


CPU_BLOCKS = stored([1, 2, 3], None, list(range(384)), block_size=128)  # what vLLM's CPU build sent (384 tokens)


@pytest.mark.parametrize(
    ("params", "indexed", "skipped"),
    [
        pytest.param(KvCache.Params(), 3, 0, id="learned by default"),
        pytest.param(KvCache.Params(block_size=16), 0, 3, id="pinned to another size"),
    ],
)
async def test_the_blocks_a_pool_skips_are_exported_by_reason_with_the_block_size(
    params: KvCache.Params, indexed: int, skipped: int
) -> None:
    context = zmq.asyncio.Context()
    feed = KvEventFeed({"p": [KvCache(params)]}, context)
    try:
        for seq in range(2):  # the same blocks twice: counted each time (logged only the first)
            feed.pools["p"].apply("r1", seq, batch(CPU_BLOCKS))
        assert series(feed, "llmfleet_gateway_kv_index_blocks") == {("p",): indexed}
        assert series(feed, "llmfleet_gateway_kv_blocks_skipped_total") == {
            ("p", "parent"): 0,
            ("p", "medium"): 0,
            ("p", "block_size"): 2 * skipped,
            ("p", "malformed"): 0,
        }
        assert series(feed, "llmfleet_gateway_kv_block_size") == {("p",): 128 if indexed else 16}
    finally:
        await feed.close()
        context.destroy(linger=0)


async def test_the_block_size_is_exported_as_0_until_it_is_learned() -> None:
    context = zmq.asyncio.Context()
    feed = KvEventFeed({"p": [KvCache()]}, context)
    try:
        assert series(feed, "llmfleet_gateway_kv_block_size") == {("p",): 0}
    finally:
        await feed.close()
        context.destroy(linger=0)


async def test_events_reach_the_index_in_order_and_the_scorer_prefers_the_holder(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    before = feed.pools["p"].batches
    await pub.send(seq, batch(stored([1, 2, 3], None, TOKENS)))
    await until(lambda: scorer.index.matched(keys(), ["r1"])["r1"] == 3)
    assert feed.pools["p"].gaps == 0 and feed.pools["p"].batches == before + 1
    endpoints = [endpoint("r1"), endpoint("r2")]
    info = request(token_ids=tuple(TOKENS[:40]))  # two full blocks, both held by r1
    assert list(scorer.score(endpoints, info)) == [1.0, 0.0]
    scorer.observe(info, endpoints[0])
    assert scorer.hit_rate() == 1.0


async def test_a_sequence_gap_drops_the_replicas_entries_before_the_next_batch(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    await pub.send(seq, batch(stored([1, 2, 3], None, TOKENS)))
    await until(lambda: scorer.index.blocks_of("r1") > 3)
    await pub.send(seq + 5, batch(stored([7], None, [5] * 16)))  # four batches lost
    await until(lambda: feed.pools["p"].gaps == 1)
    assert scorer.index.matched(keys(), ["r1"])["r1"] == 0  # what it held before the gap is no longer vouched for
    assert scorer.index.blocks_of("r1") == 1
    await pub.send(0, batch())  # the engine restarted: its counter starts again
    await until(lambda: feed.pools["p"].gaps == 2)
    assert scorer.index.blocks_of("r1") == 0


async def test_a_malformed_batch_is_dropped_and_counted_and_the_feed_goes_on(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    await pub.send(seq, b"\xc1 not msgpack")
    await pub.send(seq + 1, batch(stored([1, 2, 3], None, TOKENS)))
    await until(lambda: scorer.index.matched(keys(), ["r1"])["r1"] == 3)
    assert feed.pools["p"].malformed == 1


async def test_a_lost_stream_leaves_the_replica_to_the_load_scorers_and_says_so(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    await pub.send(seq, batch(stored([1, 2, 3], None, TOKENS)))
    await until(lambda: scorer.index.matched(keys(), ["r1"])["r1"] == 3)
    pub.socket.close(linger=0)
    await until(lambda: "r1" in scorer.stream_down)
    assert scorer.index.blocks_of("r1") == 0
    streams = {tuple(s.labels.values()): s.value for m in KvFeedCollector(feed).collect() for s in m.samples}
    assert streams[("p", "down")] == 1 and streams[("p", "up")] == 0


async def test_a_replica_that_leaves_discovery_is_forgotten(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    await pub.send(seq, batch(stored([1, 2, 3], None, TOKENS)))
    await until(lambda: scorer.index.blocks_of("r1") > 3)
    feed.sync("p", {})
    assert scorer.index.blocks_of("r1") == 0 and "r1" not in scorer.stream_down and feed.followed("p") == 0


async def test_another_replicas_topic_on_the_socket_is_not_read(stream: Stream) -> None:
    pub, scorer, feed, seq = stream.pub, stream.scorer, stream.feed, stream.seq
    before = feed.pools["p"].batches
    # r10 starts with r1: the topic's @ tells them apart
    await pub.send(seq, batch(stored([1, 2, 3], None, TOKENS)), topic=b"kv@r10@m")
    await pub.send(seq, batch())
    await until(lambda: feed.pools["p"].batches == before + 1)
    assert scorer.index.matched(keys(), ["r1"])["r1"] == 0


@pytest.mark.parametrize(("any_topic", "indexed"), [(True, 1), (False, 0)], ids=["static", "discovered"])
async def test_a_static_replica_is_followed_whatever_topic_its_engine_publishes_under(
    any_topic: bool, indexed: int
) -> None:
    # A static replica's id (<pool>-static-<i>) is the gateway's own: its engine publishes under an agent's replica
    # id (kv@r7@...) or any topic it was given. A discovered replica's socket reads only its own topic.
    context = zmq.asyncio.Context()
    scorer = KvCache()
    feed = KvEventFeed({"p": [scorer]}, context)
    pub = Publisher(context, topic="kv@r7@m")
    try:
        feed.sync("p", {"p-static-0": f"tcp://127.0.0.1:{pub.port}"}, any_topic=any_topic)
        await until(lambda: "p-static-0" not in scorer.stream_down)
        for seq in range(40):  # a SUB socket misses what was sent before it joined: send until one is taken
            await pub.send(seq, batch(stored([seq + 1], None, [seq] * 16)))
            await asyncio.sleep(0.02)
            if scorer.index.blocks_of("p-static-0"):
                break
        assert min(scorer.index.blocks_of("p-static-0"), 1) == indexed
        assert (feed.pools["p"].batches > 0) == bool(indexed)
    finally:
        await feed.close()
        pub.socket.close(linger=0)
        context.destroy(linger=0)
