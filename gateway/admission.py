"""Admission: a bounded priority queue in front of a pool, so bursts wait (or are refused) at the gateway.

A pool admits up to ``capacity`` requests at once (the app sets it to ready replicas x (maxNumSeqs +
queue.perReplicaThreshold), so backpressure scales with the pool). Beyond that, requests wait:
* ordered by tenant priority (higher first), and round-robin between the tenants of one priority, FIFO within a
  tenant, so one tenant's burst cannot starve a peer of the same priority;
* work-conserving: a request never waits while a slot is free, and every freed slot goes to the next waiter at once;
* bounded: when ``max_waiting`` requests wait, a newcomer evicts the newest waiter of a strictly lower priority
  (that one gets 429), otherwise the newcomer gets 429 at once (`QueueFull`);
* timed: a waiter still queued after ``timeout_s`` gets 503 (`QueueTimeout`), retryable by the client; one that
  joined while the pool had no capacity at all (no ready replica: scaled to zero, or every replica starting)
  waits up to ``hold_s`` instead (``gateway.queue.holdForCapacityS``, when longer), since capacity is then a
  cold start away, and the first such arrival calls ``on_cold`` (the gateway reports to the control plane at once).

`demand` counts requests in flight or waiting by priority: what the gateway reports so the control plane can
divide the pool's capacity among gateways (`control_plane.shares`).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet.protocol.clock import Clock
from gateway.errors import QueueFull, QueueTimeout

__all__ = ["Admission", "Slot"]


@dataclass(eq=False)
class _Waiter:
    tenant: str
    priority: int
    future: asyncio.Future[None]
    seq: int


@dataclass(eq=False)
class Slot:
    """A granted admission; `release` exactly once (idempotent)."""

    admission: Admission
    waited_s: float
    priority: int = 0
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release(self.priority)


class Admission:
    def __init__(
        self,
        max_waiting: int,
        timeout_s: float,
        clock: Clock,
        hold_s: float = 0.0,
        on_cold: Callable[[], None] | None = None,
    ) -> None:
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.hold_s = max(hold_s, timeout_s)
        self.on_cold = on_cold
        self._clock = clock
        self.capacity = 0
        self.in_flight = 0
        self.waiting = 0
        self._bands: dict[int, OrderedDict[str, deque[_Waiter]]] = {}
        self._seq = 0
        self._running: Counter[int] = Counter()  # in flight by priority

    def demand(self) -> dict[int, int]:
        """Requests in flight or waiting, by priority (priorities with none left out)."""
        out = Counter(self._running)
        for priority, tenants in self._bands.items():
            out[priority] += sum(len(queue) for queue in tenants.values())
        return {p: n for p, n in sorted(out.items()) if n > 0}

    def set_capacity(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._pump()

    async def acquire(self, tenant: str, priority: int) -> Slot:
        """Wait for a slot; QueueFull (429) when the queue is full, QueueTimeout (503) after ``timeout_s``."""
        if self.waiting == 0 and self.in_flight < self.capacity:
            self._take(priority)
            return Slot(self, 0.0, priority)
        if self.waiting >= self.max_waiting and not self._evict_below(priority):
            raise QueueFull(
                f"admission queue full ({self.waiting} waiting); retry later", retry_after=self._retry_after()
            )
        start = self._clock.monotonic()
        cold = self.capacity == 0
        timeout_s = self.hold_s if cold else self.timeout_s
        if cold and self.waiting == 0 and self.on_cold is not None:
            self.on_cold()  # the first to wait for a cold pool: later ones ride on the same report
        self._seq += 1
        waiter = _Waiter(tenant, priority, asyncio.get_running_loop().create_future(), self._seq)
        self._bands.setdefault(priority, OrderedDict()).setdefault(tenant, deque()).append(waiter)
        self.waiting += 1
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(waiter.future)
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                if isinstance(exc, TimeoutError):  # granted at the deadline: keep it
                    return Slot(self, self._clock.monotonic() - start, priority)
                self._release(priority)  # granted but the caller went away
                raise
            if not waiter.future.done():
                self._remove(waiter)
                waiter.future.cancel()
            if isinstance(exc, TimeoutError):
                if self.capacity == 0:
                    raise QueueTimeout(
                        f"no ready replica within {timeout_s:g}s ({self.waiting} waiting); retry later",
                        retry_after=min(30.0, max(1.0, timeout_s / 2)),
                    ) from None
                raise QueueTimeout(
                    f"no capacity within {timeout_s:g}s ({self.waiting} waiting); retry later",
                    retry_after=self._retry_after(),
                ) from None
            raise
        return Slot(self, self._clock.monotonic() - start, priority)

    def _retry_after(self) -> float:
        return min(30.0, 1.0 + self.waiting / max(1, self.capacity))

    def _take(self, priority: int) -> None:
        self.in_flight += 1
        self._running[priority] += 1

    def _release(self, priority: int) -> None:
        self.in_flight -= 1
        self._running[priority] -= 1
        self._pump()

    def _pump(self) -> None:
        while self.waiting and self.in_flight < self.capacity:
            waiter = self._pop_next()
            self._take(waiter.priority)
            waiter.future.set_result(None)

    def _pop_next(self) -> _Waiter:
        priority = max(p for p, tenants in self._bands.items() if tenants)
        tenants = self._bands[priority]
        tenant, queue = next(iter(tenants.items()))
        waiter = queue.popleft()
        if queue:
            tenants.move_to_end(tenant)  # round-robin between tenants of one priority
        else:
            del tenants[tenant]
        self.waiting -= 1
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        tenants = self._bands.get(waiter.priority)
        queue = tenants.get(waiter.tenant) if tenants is not None else None
        if tenants is None or queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del tenants[waiter.tenant]
        self.waiting -= 1

    def _evict_below(self, priority: int) -> bool:
        lower = [p for p, tenants in self._bands.items() if tenants and p < priority]
        if not lower:
            return False
        tenants = self._bands[min(lower)]
        victim = max((q[-1] for q in tenants.values()), key=lambda w: w.seq)  # the newest of the lowest band
        self._remove(victim)
        victim.future.set_exception(
            QueueFull("evicted from the admission queue by higher-priority traffic; retry later", retry_after=1.0)
        )
        return True
