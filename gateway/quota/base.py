"""Quota base: the limits of a tenant, a reservation, and the backend interface.

Model (identical in every backend):
* requests/s: a token bucket of capacity ``max(1, rps)`` (one second of burst) refilled at ``rps``/s; a request
  takes 1.
* tokens/min: a token bucket of capacity ``tokensPerMinute`` refilled at ``tokensPerMinute/60``/s; a request
  reserves ``prompt estimate + max_tokens`` and, when it ends, gets back ``reserved - used`` (never above
  capacity; a negative difference is charged).
* concurrency: at most ``maxConcurrency`` open reservations; each holds a lease that expires after ``lease_s`` so
  a gateway that crashed mid-request cannot leak slots forever.
`acquire` is all-or-nothing: when any limit refuses, nothing is taken (a rejected request never consumes quota).

A backend with a shared store reports that store's health (`StoreHealth`) for the gateway's metrics.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from fleet.spec.stack import TenantSpec
from gateway.errors import BadRequest

__all__ = ["QuotaBackend", "QuotaLimits", "Reservation", "StoreHealth", "check_fits"]


@dataclass(frozen=True)
class QuotaLimits:
    requests_per_second: float
    tokens_per_minute: int
    max_concurrency: int

    @property
    def request_burst(self) -> float:
        return max(1.0, self.requests_per_second)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_minute / 60.0

    @classmethod
    def of(cls, tenant: TenantSpec) -> QuotaLimits:
        return cls(tenant.requests_per_second, tenant.tokens_per_minute, tenant.max_concurrency)


@dataclass(frozen=True)
class Reservation:
    tenant: str
    request_id: str
    tokens: int
    limits: QuotaLimits


@dataclass(frozen=True)
class StoreHealth:
    """The shared quota store as one gateway sees it: whether it answers, and what its outages cost so far."""

    up: bool
    decided_locally: int  # requests whose quota this gateway decided alone while the store was down (fail-open)
    refused: int  # requests answered 503 because the store was down (fail-closed)


def check_fits(limits: QuotaLimits, tokens: int) -> None:
    """BadRequest when one request alone needs more tokens than the tenant's whole minute (it could never run)."""
    if tokens > limits.tokens_per_minute:
        raise BadRequest(
            f"request needs up to {tokens} tokens (prompt + max_tokens) but the tenant's quota is "
            f"{limits.tokens_per_minute} tokens/min; lower max_tokens",
            param="max_tokens",
        )


class QuotaBackend(abc.ABC):
    """Where quota state lives. Methods are safe to call concurrently from many requests."""

    @abc.abstractmethod
    async def acquire(self, tenant: str, limits: QuotaLimits, request_id: str, tokens: int) -> Reservation:
        """Reserve one request, ``tokens`` tokens and a concurrency slot, or raise QuotaExceeded (Retry-After set)."""

    @abc.abstractmethod
    async def release(self, reservation: Reservation, used_tokens: int) -> None:
        """Free the slot and return ``reservation.tokens - used_tokens`` tokens (negative: charge the excess)."""

    def health(self) -> StoreHealth | None:
        """The shared store's health; None for a backend without one (the default)."""
        return None

    def peers(self, gateways: int) -> None:  # noqa: B027 - optional hook
        """How many gateways count the tenants' limits together now (the control plane's answer to this gateway's
        last report); only a backend that may fall back to counting alone uses it (no-op by default)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (no-op by default)."""
