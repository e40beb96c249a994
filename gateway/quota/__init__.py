"""Quota: per-tenant requests/s, tokens/min and concurrency, in memory or shared through Redis.

Both backends implement `QuotaBackend` with the same semantics (see `gateway.quota.base`):
reserve at admission (one request, prompt + max_tokens tokens, one concurrency slot) all-or-nothing, so a
rejected request consumes nothing; reconcile at the end with the tokens actually used.
"""

from __future__ import annotations

from collections.abc import Callable

from fleet import contract
from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation, check_fits
from gateway.quota.memory import MemoryQuota
from gateway.settings import GatewaySettings

__all__ = ["MemoryQuota", "QuotaBackend", "QuotaLimits", "Reservation", "check_fits", "quota_backend"]


def quota_backend(settings: GatewaySettings, clock: Callable[[], float]) -> QuotaBackend:
    """The backend ``gateway.quotaBackend`` names; ValueError when it is redis and no URL is configured."""
    lease = settings.spec.gateway.timeouts.total_s + 60
    if settings.spec.gateway.quota_backend == "redis":
        from redis.asyncio import Redis

        from gateway.quota.redis import RedisQuota

        url = settings.quota_redis_url
        if not url:
            raise ValueError(
                f"gateway.quotaBackend is 'redis' but neither gateway.redisUrl nor {contract.REDIS_URL_ENV} is set"
            )
        return RedisQuota(Redis.from_url(url), lease_s=lease)
    return MemoryQuota(clock, lease_s=lease)
