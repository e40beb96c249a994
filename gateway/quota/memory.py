"""MemoryQuota: the quota model of `gateway.quota.base` in this process (one gateway replica only).

Limits are per process: with N gateway replicas a tenant gets N times its quota; use the Redis backend there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.protocol.clock import Clock
from gateway.errors import QuotaExceeded
from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation

__all__ = ["MemoryQuota"]


@dataclass
class _Bucket:
    level: float
    ts: float

    def refill(self, now: float, capacity: float, rate: float) -> float:
        self.level = min(capacity, self.level + max(0.0, now - self.ts) * rate)
        self.ts = now
        return self.level


@dataclass
class _TenantState:
    requests: _Bucket
    tokens: _Bucket
    open: dict[str, float] = field(default_factory=dict)  # request id -> lease expiry


class MemoryQuota(QuotaBackend):
    def __init__(self, clock: Clock, lease_s: float = 900.0) -> None:
        self._clock = clock
        self._lease_s = lease_s
        self._tenants: dict[str, _TenantState] = {}

    def _state(self, tenant: str, limits: QuotaLimits, now: float) -> _TenantState:
        state = self._tenants.get(tenant)
        if state is None:
            state = _TenantState(_Bucket(limits.request_burst, now), _Bucket(float(limits.tokens_per_minute), now))
            self._tenants[tenant] = state
        return state

    async def acquire(self, tenant: str, limits: QuotaLimits, request_id: str, tokens: int) -> Reservation:
        now = self._clock.monotonic()
        state = self._state(tenant, limits, now)
        expired = [rid for rid, until in state.open.items() if until <= now]
        for rid in expired:
            del state.open[rid]
        if len(state.open) >= limits.max_concurrency:
            raise QuotaExceeded(
                f"tenant {tenant!r} has {len(state.open)} requests in flight (maxConcurrency {limits.max_concurrency})",
                retry_after=1.0,
            )
        req = state.requests.refill(now, limits.request_burst, limits.requests_per_second)
        if req < 1.0:
            raise QuotaExceeded(
                f"tenant {tenant!r} is over {limits.requests_per_second:g} requests/s",
                retry_after=(1.0 - req) / limits.requests_per_second,
            )
        tok = state.tokens.refill(now, float(limits.tokens_per_minute), limits.tokens_per_second)
        if tok < tokens:
            raise QuotaExceeded(
                f"tenant {tenant!r} is over {limits.tokens_per_minute} tokens/min (request reserves {tokens})",
                retry_after=(tokens - tok) / limits.tokens_per_second,
            )
        state.requests.level -= 1.0
        state.tokens.level -= tokens
        state.open[request_id] = now + self._lease_s
        return Reservation(tenant, request_id, tokens, limits)

    async def release(self, reservation: Reservation, used_tokens: int) -> None:
        state = self._tenants.get(reservation.tenant)
        if state is None:
            return
        state.open.pop(reservation.request_id, None)
        # Negative when the prompt estimate was low: the extra use is charged, so the bucket stays exact.
        refund = reservation.tokens - max(0, used_tokens)
        if refund != 0:
            limits = reservation.limits
            now = self._clock.monotonic()
            level = state.tokens.refill(now, float(limits.tokens_per_minute), limits.tokens_per_second)
            state.tokens.level = min(float(limits.tokens_per_minute), level + refund)
