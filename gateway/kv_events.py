"""KV event feed: one ZMQ SUB socket per replica that publishes KV-cache events, feeding its pool's ``kv-cache``
scorers (`gateway.routing.scorers.kv_cache`).

The replicas and their event sockets come from discovery (each report's ``kv_events_url``, `Refresher`). Per
replica, `follow` connects a SUB socket subscribed to the replica's own topic (``kv@<replica>@``, the agent's; every
topic for a static replica, whose id is the gateway's own),
reads vLLM's three frames ``[topic, seq, payload]`` (seq 8 bytes big-endian; payload the msgpack batch
``[ts, events, dp_rank]``) and applies each batch's events to the index, in order:

* ``seq`` is tracked per replica: a gap (batches the socket dropped past its high-water mark, or missed while
  reconnecting) or a seq that goes back (the engine restarted: its counter starts at 0, and its cache is empty)
  drops that replica's entries before the batch is applied, so the index never claims blocks it cannot vouch for.
  The engines run without a replay socket, so dropping is the one recovery; the entries come back as the engine
  caches again.
* The socket's monitor says when the TCP connection is up. While it is down the replica is in the scorer's
  ``stream_down`` (its entries dropped, it scores 0 and the load scorers decide for it), and the
  ``kv_event_streams{state="down"}`` series counts it.
* A replica that leaves discovery (or whose socket moves) is forgotten: task cancelled, socket closed, entries
  dropped.
* A malformed batch is dropped and counted; it never stops the feed.
* Nothing is skipped silently: the blocks an index did not take (`gateway.routing.kv_index`, by reason: an unknown
  parent, another medium, another block size, malformed) are counted in ``kv_blocks_skipped_total{pool,reason}``,
  and the first skip of each replica for each reason is logged: at WARNING for the reasons that mean the index
  cannot work for that replica (``block_size``: its engine's ``--block-size`` is not the index's; ``medium``,
  ``malformed``), at INFO for ``parent`` (routine: a stream joined mid-chain, or after a gap).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from zmq.utils.monitor import recv_monitor_message

from gateway.routing.kv_index import SKIP_REASONS, KvIndex
from gateway.routing.scorers.kv_cache import KvCache

__all__ = ["KvEventFeed", "PoolFeed", "decode_batch"]

log = logging.getLogger("llmfleet.gateway.kv_events")


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """The events of one ``KVEventBatch`` payload (``[ts, events, dp_rank?]``); ValueError when malformed."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a [ts, events, dp_rank] batch")
    events = batch[1]
    if not all(isinstance(e, dict) for e in events):
        raise ValueError("events are not maps (a vLLM older than the map encoding)")
    return events


@dataclass
class PoolFeed:
    """One pool's scorers and what its streams have done."""

    scorers: list[KvCache]
    batches: int = 0
    gaps: int = 0
    malformed: int = 0
    seq: dict[str, int] = field(default_factory=dict)  # replica -> last seq applied
    logged: set[tuple[str, str]] = field(default_factory=set)  # (replica, skip reason) already logged

    def apply(self, replica: str, seq: int, payload: bytes) -> None:
        """Apply one message of ``replica``'s stream (module docstring: gaps and restarts drop its entries)."""
        last = self.seq.get(replica)
        if last is not None and seq != last + 1:
            self.gaps += 1
            self.drop(replica)
        self.seq[replica] = seq
        index = self.scorers[0].index  # every scorer is fed the same events; the first one's skips are logged
        before = dict(index.skipped)
        try:
            events = decode_batch(payload)
            for scorer in self.scorers:
                scorer.index.apply(replica, events)
        except (ValueError, KeyError, TypeError) as exc:
            self.malformed += 1
            log.warning("dropped a malformed KV event batch from %s: %s", replica, exc)
            return
        finally:
            self._log_skips(replica, index, before)
        self.batches += 1

    def _log_skips(self, replica: str, index: KvIndex, before: dict[str, int]) -> None:
        """Log the first skip of ``replica``'s blocks for each reason (the counter counts them all)."""
        for reason, count in index.skipped.items():
            if count == before.get(reason, 0) or (replica, reason) in self.logged:
                continue
            self.logged.add((replica, reason))
            level = logging.INFO if reason == "parent" else logging.WARNING  # parent: routine (module docstring)
            why, blocks = _why(reason, index, replica), count - before.get(reason, 0)
            log.log(
                level, "KV events of %s: %d block(s) not indexed: %s (logged once, all counted)", replica, blocks, why
            )

    def drop(self, replica: str) -> None:
        for scorer in self.scorers:
            scorer.index.forget(replica)

    def forget(self, replica: str) -> None:
        """``replica`` is no longer followed: nothing of it stays."""
        self.drop(replica)
        self.seq.pop(replica, None)
        self.logged = {(r, reason) for r, reason in self.logged if r != replica}
        for scorer in self.scorers:
            scorer.stream_down.discard(replica)

    def down(self, replica: str, is_down: bool) -> None:
        for scorer in self.scorers:
            (scorer.stream_down.add if is_down else scorer.stream_down.discard)(replica)
        if is_down:
            self.drop(replica)
            self.seq.pop(replica, None)


def _why(reason: str, index: KvIndex, replica: str) -> str:
    """What a skip of ``reason`` means, for the log line."""
    if reason == "block_size":
        origin = (
            "pinned by the kv-cache scorer's blockSize" if index.pinned else "learned from the pool's other replicas"
        )
        return (
            f"its engine's blocks are of {index.reported.get(replica, '?')} tokens, the index's of {index.block_size} "
            f"({origin}): kv-cache cannot route to it until they agree (the engines' --block-size)"
        )
    return {
        "parent": "their parent block was never announced (the stream joined mid-chain, or after a gap)",
        "medium": "cached on another medium than the GPU (KV offload)",
        "malformed": "token_ids do not fill the blocks named",
    }.get(reason, reason)


class KvEventFeed:
    """The gateway's subscriptions, by pool; ``sync`` after each discovery round, ``close`` on shutdown."""

    def __init__(self, pools: Mapping[str, list[KvCache]], context: zmq.asyncio.Context | None = None) -> None:
        self.pools = {name: PoolFeed(scorers) for name, scorers in pools.items() if scorers}
        self._context = context or zmq.asyncio.Context.instance()
        self._tasks: dict[tuple[str, str], tuple[str, asyncio.Task[None]]] = {}  # (pool, replica) -> url, task

    def sync(self, pool: str, replicas: Mapping[str, str | None], *, any_topic: bool = False) -> None:
        """Follow each of ``pool``'s replicas with an event socket (replica -> url); forget the others.

        Each socket subscribes to its replica's topic (``kv@<replica>@``, as the agent names it), or with
        ``any_topic`` to every topic: a static replica's id (``<pool>-static-<i>``) is the gateway's own, not the
        one its engine publishes under (an agent's replica id, or whatever topic the engine was given), and one
        static address is one engine, so every batch on it is that replica's."""
        feed = self.pools.get(pool)
        if feed is None:
            return
        for (p, replica), (followed, task) in list(self._tasks.items()):
            if p == pool and replicas.get(replica) != followed:
                task.cancel()
                del self._tasks[(p, replica)]
                feed.forget(replica)
        for replica, url in replicas.items():
            if url is not None and (pool, replica) not in self._tasks:
                feed.down(replica, True)  # until its socket connects
                topic = b"" if any_topic else f"kv@{replica}@".encode()
                self._tasks[(pool, replica)] = (url, asyncio.create_task(self.follow(feed, replica, url, topic)))

    def followed(self, pool: str) -> int:
        """Replicas of ``pool`` whose event socket is followed (connected or not)."""
        return sum(1 for p, _ in self._tasks if p == pool)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def follow(self, feed: PoolFeed, replica: str, url: str, topic: bytes) -> None:
        """Read ``replica``'s stream (the batches whose topic starts with ``topic``) until cancelled."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.setsockopt(zmq.LINGER, 0)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(url)
        watcher = asyncio.create_task(self._watch(feed, replica, monitor))
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    feed.malformed += 1
                    continue
                feed.apply(replica, int.from_bytes(frames[1], "big"), frames[2])
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _watch(self, feed: PoolFeed, replica: str, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = await recv_monitor_message(monitor)
            up = event["event"] == zmq.EVENT_CONNECTED
            feed.down(replica, not up)
            log.info("KV event stream of %s %s", replica, "connected" if up else "lost")


class KvFeedCollector(Collector):
    """The feed's series at scrape time (the metrics module's docstring lists them)."""

    def __init__(self, feed: KvEventFeed) -> None:
        self._feed = feed

    def collect(self) -> Iterable[Metric]:
        p = "llmfleet_gateway_"
        streams = GaugeMetricFamily(p + "kv_event_streams", "Replicas' KV event streams", labels=["pool", "state"])
        blocks = GaugeMetricFamily(p + "kv_index_blocks", "Prefix blocks the KV index holds", labels=["pool"])
        batches = CounterMetricFamily(p + "kv_event_batches", "KV event batches applied", labels=["pool"])
        gaps = CounterMetricFamily(p + "kv_event_gaps", "Sequence gaps (entries dropped)", labels=["pool"])
        malformed = CounterMetricFamily(p + "kv_event_malformed", "KV event batches dropped", labels=["pool"])
        prompt = CounterMetricFamily(p + "kv_prompt_blocks", "Full prompt blocks routed by kv-cache", labels=["pool"])
        hit = CounterMetricFamily(p + "kv_hit_blocks", "Of those, held by the chosen replica", labels=["pool"])
        skipped = CounterMetricFamily(
            p + "kv_blocks_skipped", "Stored blocks the KV index did not take, by reason", labels=["pool", "reason"]
        )
        size = GaugeMetricFamily(
            p + "kv_block_size",
            "Tokens per block the KV index hashes prompts with (0: not learned yet)",
            labels=["pool"],
        )
        for pool, feed in self._feed.pools.items():
            scorer = feed.scorers[0]
            down = len(scorer.stream_down)
            streams.add_metric([pool, "up"], max(0, self._feed.followed(pool) - down))
            streams.add_metric([pool, "down"], down)
            blocks.add_metric([pool], len(scorer.index))
            batches.add_metric([pool], feed.batches)
            gaps.add_metric([pool], feed.gaps)
            malformed.add_metric([pool], feed.malformed)
            prompt.add_metric([pool], sum(s.prompt_blocks for s in feed.scorers))
            hit.add_metric([pool], sum(s.hit_blocks for s in feed.scorers))
            for reason in SKIP_REASONS:  # every reason from the start, at 0: rate() sees the first skip
                skipped.add_metric([pool, reason], scorer.index.skipped.get(reason, 0))
            size.add_metric([pool], scorer.index.block_size or 0)
        yield from (streams, blocks, batches, gaps, malformed, prompt, hit, skipped, size)
