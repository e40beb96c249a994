"""KV publisher: vLLM 0.33's ``ZmqEventPublisher`` wire, on the engine's event loop.

Sockets (``vllm/distributed/kv_events.py`` ``ZmqEventPublisher``):

* PUB at ``endpoint``, high-water mark ``hwm`` (past it ZMQ drops). It **binds** when the endpoint contains ``*``
  or ``::`` or is ``ipc://`` / ``inproc://``, else it **connects** (a subscriber that binds, as llm-d's does).
* Each batch is the three frames ``[topic, seq, payload]``: ``seq`` is an 8-byte big-endian unsigned counter
  from 0 in each process (a restart starts again at 0), ``payload`` is `engine_sim.kv_events.encode_batch`.
* ROUTER at ``replay_endpoint`` (always bound; send high-water mark ``2 * (buffer_steps + 1)``, so a full
  replay and its marker fit). A REQ or DEALER client sends one 8-byte big-endian start seq; it gets
  ``[topic, seq, payload]`` for every batch of the last ``buffer_steps`` with seq >= start, then the end
  marker ``[b"", -1 as 8 signed bytes, b""]``.

`publish` never blocks the caller (the engine's step loop): it puts the batch on a queue of ``max_queue_size``
that a task drains onto the socket. Where vLLM's ``Queue.put`` would wait for room, a full queue here drops
the batch and counts it in ``dropped``; seq numbers are given out as batches are sent, so a drop leaves no gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

import zmq
import zmq.asyncio

from engine_sim.kv_events import KVEvent, KVEventsConfig, encode_batch

__all__ = ["END_SEQ", "ZmqKVEventPublisher", "binds"]

log = logging.getLogger("engine_sim")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_DRAIN_S = 1.0  # how long `close` waits for queued batches to go out (vLLM's SHUTDOWN_TIMEOUT)


def binds(endpoint: str) -> bool:
    """vLLM's rule for the PUB socket: bind wildcard and ipc/inproc endpoints, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqKVEventPublisher:
    """One process's KV-event PUB socket and replay ROUTER; `start` inside the event loop, `close` at the end."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.config = config
        self.data_parallel_rank = data_parallel_rank
        self.dropped = 0  # batches refused because the queue was full
        self._topic = config.topic.encode()
        self._queue: asyncio.Queue[tuple[float, list[KVEvent]]] = asyncio.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._context: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Open the sockets and start sending; zmq.ZMQError when an endpoint cannot be bound or is malformed."""
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(self.config.hwm)
        endpoint = self.config.endpoint
        if binds(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        how = "bound to" if binds(endpoint) else "connected to"
        log.info("KV events: PUB %s %s, topic %r", how, endpoint, self.config.topic)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._send_batches(self._pub), name="kv-events-pub"))
        if self.config.replay_endpoint is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.SNDHWM, 2 * (self.config.buffer_steps + 1))
            self._router.bind(self.config.replay_endpoint)
            log.info("KV events: replay ROUTER bound to %s", self.config.replay_endpoint)
            self._tasks.append(loop.create_task(self._serve_replays(self._router), name="kv-events-replay"))

    def publish(self, ts: float, events: list[KVEvent]) -> None:
        """Queue one batch (``ts`` is wall-clock seconds); returns at once, dropping the batch if the queue is full."""
        try:
            self._queue.put_nowait((ts, events))
        except asyncio.QueueFull:
            if self.dropped == 0:
                log.warning("KV events: queue full (%d batches); dropping batches", self.config.max_queue_size)
            self.dropped += 1

    async def close(self) -> None:
        """Send what is queued (up to a second), then stop and close the sockets without lingering."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=_DRAIN_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        if self._context is not None:
            self._context.term()

    async def _send_batches(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            ts, events = await self._queue.get()
            try:
                payload = encode_batch(ts, events, self.data_parallel_rank)
                seq = self._next_seq
                self._next_seq += 1
                await pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
                self._buffer.append((seq, payload))
            finally:
                self._queue.task_done()

    async def _serve_replays(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:  # [identity, empty delimiter, start seq] from a REQ or DEALER client
                log.warning("KV events: invalid replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):  # a copy: batches keep arriving while this one awaits
                if seq >= start_seq:
                    await router.send_multipart([client, b"", self._topic, seq.to_bytes(8, "big"), payload])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])
