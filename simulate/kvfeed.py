"""KvFeed: the simulated replicas' KV-cache events, delivered to the ``kv-cache`` scorer's index after a delay.

In the fleet each engine publishes its events over ZMQ after every step and each gateway's feed
(`gateway.kv_events`) applies them to its `gateway.routing.kv_index.KvIndex`. Here the replicas' block pools
record the same events (`engine_sim.kv_events.KVEventLog`, on only when the router has a ``kv-cache`` scorer);
`simulate.fleet_sim.FleetSim` takes them after each step, decode run and scrape and queues their delivery
``delay_s`` later as an event of its loop. A replica that stops or sleeps is forgotten the same way: an
``AllBlocksCleared`` (a level-1 sleep's prefix-cache reset, or the feed's forget of a replica that left) that
arrives ``delay_s`` later, after the events sent before it.

The default delay, 50 ms: ZMQ over a LAN adds well under a millisecond, but the engine publishes from a thread
after the step that cached the blocks, and the gateway decodes and applies each batch on the event loop that also
proxies streams; tens of milliseconds under load is the realistic order, and 50 ms errs on the slow side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_sim.kv_events import KVEvent
from engine_sim.scheduler import Scheduler
from gateway.routing.base import Router
from gateway.routing.kv_index import KvIndex
from gateway.routing.scorers.kv_cache import KvCache

__all__ = ["CLEARED", "KV_EVENT_DELAY_S", "KvFeed"]

KV_EVENT_DELAY_S = 0.05
CLEARED: list[KVEvent] = [{"type": "AllBlocksCleared"}]
Push = Callable[[float, str, Any], None]  # `simulate.fleet_sim.FleetSim.push`: queue an event of the loop


@dataclass
class KvFeed:
    """Where a router's ``kv-cache`` scorer learns the replicas' blocks, and how late."""

    index: KvIndex
    delay_s: float = KV_EVENT_DELAY_S

    @classmethod
    def for_router(cls, router: Router, delay_s: float = KV_EVENT_DELAY_S) -> KvFeed | None:
        """The feed of ``router``'s ``kv-cache`` scorer; None when it has none (the engines need record nothing)."""
        if delay_s < 0:
            raise ValueError(f"KV event delay {delay_s}s: give 0 or more")
        for scorer, _ in router.scorers:
            if isinstance(scorer, KvCache):
                return cls(scorer.index, delay_s)
        return None

    def publish(self, push: Push, replica: str, scheduler: Scheduler, now: float, cleared: bool = False) -> None:
        """Queue (``push``) the delivery of what ``scheduler``'s block pool recorded since the last publish,
        ``delay_s`` from ``now``, as ``("kv-events", (replica, events))``; ``cleared``: an AllBlocksCleared after
        them (the replica stops or sleeps)."""
        log = scheduler.kv.pool.events
        events = ([] if log is None else log.take()) + (CLEARED if cleared else [])
        if events:
            push(now + self.delay_s, "kv-events", (replica, events))
