"""MemoryQuota: all-or-nothing reservation, refill, reconciliation, concurrency leases."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest, QuotaExceeded
from gateway.quota import MemoryQuota, QuotaLimits, check_fits
from tests.gateway.builders import ManualClock

LIMITS = QuotaLimits(requests_per_second=2, tokens_per_minute=600, max_concurrency=3)


async def test_requests_per_second_refill_and_retry_after() -> None:
    clock = ManualClock()
    quota = MemoryQuota(clock)
    await quota.acquire("t", LIMITS, "1", 1)
    await quota.acquire("t", LIMITS, "2", 1)
    with pytest.raises(QuotaExceeded) as info:
        await quota.acquire("t", LIMITS, "3", 1)
    assert info.value.retry_after == pytest.approx(0.5)
    clock.now = 0.5
    await quota.acquire("t", LIMITS, "3", 1)


async def test_rejected_request_consumes_nothing() -> None:
    clock = ManualClock()
    quota = MemoryQuota(clock)
    await quota.acquire("t", LIMITS, "1", 590)
    with pytest.raises(QuotaExceeded, match="tokens/min"):
        await quota.acquire("t", LIMITS, "2", 100)
    # The rejected request took neither a request token nor a slot: one more small request still fits.
    await quota.acquire("t", LIMITS, "3", 10)


async def test_tokens_reconciled_with_actual_usage() -> None:
    clock = ManualClock()
    quota = MemoryQuota(clock)
    big = await quota.acquire("t", LIMITS, "1", 500)
    with pytest.raises(QuotaExceeded):
        await quota.acquire("t", LIMITS, "2", 200)
    await quota.release(big, used_tokens=100)  # 400 come back
    clock.now = 1.0  # and one more request token
    await quota.acquire("t", LIMITS, "2", 200)


@pytest.mark.parametrize(("held", "fits"), [(2, True), (3, False)])
async def test_max_concurrency(held: int, fits: bool) -> None:
    quota = MemoryQuota(ManualClock())
    limits = QuotaLimits(requests_per_second=100, tokens_per_minute=10_000, max_concurrency=3)
    for i in range(held):
        await quota.acquire("t", limits, str(i), 1)
    if fits:
        await quota.acquire("t", limits, "x", 1)
    else:
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await quota.acquire("t", limits, "x", 1)


async def test_concurrency_lease_expires() -> None:
    clock = ManualClock()
    quota = MemoryQuota(clock, lease_s=10)
    limits = QuotaLimits(requests_per_second=100, tokens_per_minute=10_000, max_concurrency=1)
    await quota.acquire("t", limits, "lost", 1)  # never released (its gateway crashed)
    clock.now = 11
    await quota.acquire("t", limits, "next", 1)


def test_request_larger_than_the_whole_quota_is_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        check_fits(LIMITS, 601)
