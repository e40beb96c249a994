"""Admission: priority order, fairness within a priority, bounds, timeouts, work conservation."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleet.protocol.clock import SystemClock
from gateway.admission import Admission, Slot
from gateway.errors import QueueFull, QueueTimeout


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_free_capacity_never_waits() -> None:
    admission = Admission(max_waiting=4, timeout_s=1, clock=SystemClock())
    admission.set_capacity(2)
    first, second = await admission.acquire("a", 1), await admission.acquire("a", 1)
    assert (first.waited_s, second.waited_s, admission.in_flight) == (0, 0, 2)


async def test_freed_slots_go_by_priority_then_round_robin_between_tenants() -> None:
    admission = Admission(max_waiting=16, timeout_s=5, clock=SystemClock())
    admission.set_capacity(1)
    holder = await admission.acquire("x", 1)
    order: list[str] = []

    async def wait(tenant: str, priority: int, tag: str) -> None:
        slot = await admission.acquire(tenant, priority)
        order.append(tag)
        slot.release()

    tasks = [
        asyncio.create_task(wait(t, p, tag))
        for t, p, tag in [("low", 1, "low1"), ("a", 5, "a1"), ("a", 5, "a2"), ("a", 5, "a3"), ("b", 5, "b1")]
    ]
    await _settle()
    assert admission.waiting == 5
    holder.release()
    await asyncio.gather(*tasks)
    assert order == ["a1", "b1", "a2", "a3", "low1"]


async def test_full_queue_rejects_or_evicts_lower_priority() -> None:
    admission = Admission(max_waiting=1, timeout_s=5, clock=SystemClock())
    admission.set_capacity(0)
    low = asyncio.create_task(admission.acquire("low", 1))
    await _settle()
    with pytest.raises(QueueFull) as full:
        await admission.acquire("peer", 1)  # same priority: rejected at once
    assert full.value.retry_after is not None
    high = asyncio.create_task(admission.acquire("high", 9))
    await _settle()
    with pytest.raises(QueueFull, match="evicted"):
        await low
    admission.set_capacity(1)
    assert isinstance(await high, Slot)


async def test_queue_timeout_is_a_503_and_frees_the_place() -> None:
    admission = Admission(max_waiting=1, timeout_s=0.05, clock=SystemClock())
    with pytest.raises(QueueTimeout):
        await admission.acquire("a", 1)
    assert admission.waiting == 0


async def test_cancelled_waiter_leaves_the_queue_and_keeps_no_slot() -> None:
    admission = Admission(max_waiting=4, timeout_s=5, clock=SystemClock())
    task = asyncio.create_task(admission.acquire("a", 1))
    await _settle()
    task.cancel()
    await _settle()
    admission.set_capacity(1)
    assert (admission.waiting, admission.in_flight) == (0, 0)


async def test_a_request_for_a_pool_with_no_capacity_is_held_for_the_hold_not_the_queue_timeout() -> None:
    colds: list[None] = []
    admission = Admission(4, timeout_s=0.05, clock=SystemClock(), hold_s=5.0, on_cold=lambda: colds.append(None))
    held = [asyncio.create_task(admission.acquire("a", 1)) for _ in range(3)]
    done, _ = await asyncio.wait(held, timeout=0.2)  # four queue timeouts: the cold pool's waiters are still held
    assert not done and admission.waiting == 3
    assert len(colds) == 1  # the first to wait reports at once; the others ride on it
    admission.set_capacity(3)  # the first replica is ready
    slots = await asyncio.gather(*held)
    assert all(s.waited_s >= 0.2 for s in slots)


async def test_a_held_request_gets_503_with_retry_after_when_the_hold_expires() -> None:
    admission = Admission(4, timeout_s=0.05, clock=SystemClock(), hold_s=0.2)
    with pytest.raises(QueueTimeout, match=r"no ready replica within 0.2s") as raised:
        await admission.acquire("a", 1)
    assert raised.value.retry_after == 1.0


async def test_a_warm_pools_queue_keeps_its_own_timeout() -> None:
    admission = Admission(4, timeout_s=0.05, clock=SystemClock(), hold_s=5.0, on_cold=lambda: pytest.fail("cold"))
    admission.set_capacity(1)
    holder = await admission.acquire("a", 1)
    started = time.monotonic()
    with pytest.raises(QueueTimeout, match="no capacity within 0.05s"):
        await admission.acquire("a", 1)
    assert time.monotonic() - started < 1.0
    holder.release()
