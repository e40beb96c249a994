"""Quota: per-tenant requests/s, tokens/min and concurrency, in memory or shared through Redis.

Both backends implement `QuotaBackend` with the same semantics (see `gateway.quota.base`):
reserve at admission (one request, prompt + max_tokens tokens, one concurrency slot) all-or-nothing, so a
rejected request consumes nothing; reconcile at the end with the tokens actually used. With Redis, a
`FailoverQuota` decides what happens while Redis does not answer (``gateway.quotaStoreDown``).
"""

from __future__ import annotations

from fleet.protocol import contract
from fleet.protocol.clock import Clock
from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation, StoreHealth, check_fits
from gateway.quota.memory import MemoryQuota
from gateway.settings import GatewaySettings

__all__ = [
    "MemoryQuota",
    "QuotaBackend",
    "QuotaLimits",
    "Reservation",
    "StoreHealth",
    "check_fits",
    "quota_backend",
]


def quota_backend(settings: GatewaySettings, clock: Clock) -> QuotaBackend:
    """The backend ``gateway.quotaBackend`` names; ValueError when it is redis and no URL is configured.

    Redis comes wrapped in a `FailoverQuota` (``gateway.quotaStoreDown``) whose local fallback counts with
    ``clock``; its share divisor is the control plane's count of reporting gateways while fresh
    (``controlPlane.staleAfterS``), else ``gateway.replicas``, the replica count the stack deploys.
    """
    gateway = settings.spec.gateway
    lease = gateway.timeouts.total_s + 60
    if gateway.quota_backend == "redis":
        from gateway.quota.failover import FailoverQuota
        from gateway.quota.redis import RedisQuota

        url = settings.quota_redis_url
        if not url:
            raise ValueError(
                f"gateway.quotaBackend is 'redis' but neither gateway.redisUrl nor {contract.REDIS_URL_ENV} is set"
            )
        return FailoverQuota(
            RedisQuota.from_url(url, lease_s=lease),
            MemoryQuota(clock, lease_s=lease),
            mode=gateway.quota_store_down,
            gateways=gateway.replicas,
            clock=clock,
            peers_hold_s=settings.spec.control_plane.stale_after_s,
        )
    return MemoryQuota(clock, lease_s=lease)
