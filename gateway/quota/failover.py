"""FailoverQuota: the shared Redis quota while Redis answers; a local share of it, or a 503, while it does not.

``gateway.quotaStoreDown`` chooses what an outage means:

* ``fail-open`` (default): each gateway counts quotas in memory (`MemoryQuota`), holding ``1 / N`` of every
  tenant's limits: requests/s and tokens/min divided by N, maxConcurrency divided and rounded down, each at least 1
  (so a tenant is never locked out entirely; with more gateways than slots they together may admit up to one
  request each). N is the number of gateways the control plane counts as reporting (not stale) in its answer to
  this gateway's last report (`peers`), trusted for ``peers_hold_s`` (``controlPlane.staleAfterS``) after it came:
  a rollout's surge or a missing pod changes it within a report interval. Without a fresh count (no control
  plane, or it is down too) N is ``gateway.replicas``, the count the stack deploys.
* ``fail-closed``: `QuotaStoreUnavailable`, a 503 with Retry-After, as before.

State machine: *up* until a call to Redis fails (one WARNING line), then *down*; while down, the first request at
least ``probe_interval_s`` after the last probe PINGs Redis with ``probe_timeout_s`` (others go on without waiting,
so a dead Redis sees at most one probe per interval, never one call per request). A PING that answers makes it *up*
again (one WARNING line) and that request already uses Redis. Releases that could not reach Redis (reservations
taken there before the outage) are kept, up to ``max_pending``, and settled in the background when it answers
again, so a network partition that heals leaks no concurrency slot for a lease's length. A reservation taken
locally is released locally, whenever that is. At most ``max_in_flight`` calls go to Redis at once: a burst waits
for a turn rather than opening a connection per request (on a busy host their connect timeouts would look like an
outage), and a hung Redis costs the burst one timeout, not one per request.

Across a transition the two counts do not see each other's open requests: for the length of the requests in flight
at that moment a tenant can exceed its limit by what the other side holds. `health` feeds the gateway's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Literal

from fleet.protocol.clock import Clock
from gateway.errors import QuotaStoreUnavailable
from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation, StoreHealth
from gateway.quota.memory import MemoryQuota
from gateway.quota.redis import RedisQuota

__all__ = ["FailoverQuota", "local_share"]

log = logging.getLogger("llmfleet.gateway.quota")

Mode = Literal["fail-open", "fail-closed"]


@dataclass(frozen=True)
class _LocalReservation(Reservation):
    """A reservation counted in this gateway's memory during an outage (released there too)."""


def local_share(limits: QuotaLimits, gateways: int) -> QuotaLimits:
    """One gateway's part of ``limits`` when ``gateways`` count them apart: divided, each at least 1."""
    if gateways <= 1:
        return limits
    return QuotaLimits(
        requests_per_second=limits.requests_per_second / gateways,
        tokens_per_minute=max(1, limits.tokens_per_minute // gateways),
        max_concurrency=max(1, limits.max_concurrency // gateways),
    )


class FailoverQuota(QuotaBackend):
    def __init__(
        self,
        shared: RedisQuota,
        local: MemoryQuota,
        *,
        mode: Mode,
        gateways: int,
        clock: Clock,
        peers_hold_s: float = 0.0,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 0.5,
        max_pending: int = 10_000,
        max_in_flight: int = 32,
    ) -> None:
        self._shared = shared
        self._local = local
        self._mode: Mode = mode
        self._gateways = gateways  # the configured count, when the control plane's is missing or old
        self._peers: tuple[int, float] | None = None  # (the control plane's count, when it came)
        self._peers_hold_s = peers_hold_s
        self._clock = clock
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._up = True
        self._probe_at = 0.0  # while down: no probe before this
        self._probing = False
        self._pending: deque[tuple[Reservation, int]] = deque(maxlen=max_pending)
        self._settling: asyncio.Task[None] | None = None
        # At most this many calls to Redis at once (so at most this many connections): a burst of requests waits
        # here instead of opening a connection each, whose connect timeouts on a busy host would look like an
        # outage; and a request that waited sees an outage found meanwhile before it calls Redis.
        self._gate = asyncio.Semaphore(max_in_flight)
        self._decided_locally = 0
        self._refused = 0

    def peers(self, gateways: int) -> None:
        self._peers = (max(1, gateways), self._clock.monotonic())

    def divisor(self) -> int:
        """N of the local share: the control plane's fresh count of gateways, else the configured one."""
        if self._peers is not None and self._clock.monotonic() - self._peers[1] <= self._peers_hold_s:
            return self._peers[0]
        return self._gateways

    def health(self) -> StoreHealth:
        return StoreHealth(up=self._up, decided_locally=self._decided_locally, refused=self._refused)

    async def acquire(self, tenant: str, limits: QuotaLimits, request_id: str, tokens: int) -> Reservation:
        if self._up or await self._answers_again():
            async with self._gate:
                if self._up:
                    try:
                        return await self._shared.acquire(tenant, limits, request_id, tokens)
                    except QuotaStoreUnavailable as exc:
                        self._went_down(exc)
        if self._mode == "fail-closed":
            self._refused += 1
            raise QuotaStoreUnavailable("the quota store is unavailable; retry shortly")
        self._decided_locally += 1
        taken = await self._local.acquire(tenant, local_share(limits, self.divisor()), request_id, tokens)
        return _LocalReservation(taken.tenant, taken.request_id, taken.tokens, taken.limits)

    async def release(self, reservation: Reservation, used_tokens: int) -> None:
        if isinstance(reservation, _LocalReservation):
            await self._local.release(reservation, used_tokens)
            return
        if self._up:
            async with self._gate:
                if self._up:
                    try:
                        await self._shared.settle(reservation, used_tokens)
                        return
                    except QuotaStoreUnavailable as exc:
                        self._went_down(exc)
        self._pending.append((reservation, used_tokens))

    async def close(self) -> None:
        if self._settling is not None:
            self._settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._settling
        await self._shared.close()

    def _went_down(self, exc: QuotaStoreUnavailable) -> None:
        self._probe_at = self._clock.monotonic() + self._probe_interval_s
        if not self._up:
            return  # concurrent requests failing on the same outage: one line only
        self._up = False
        cause = f"{type(exc.__cause__).__name__}: {exc.__cause__}" if exc.__cause__ is not None else str(exc)
        if self._mode == "fail-open":
            log.warning(
                "quota store down (%s): counting quotas in this gateway, 1/%d of each tenant's limits, until it "
                "answers again",
                cause,
                self.divisor(),
            )
        else:
            log.warning("quota store down (%s): refusing requests with 503 until it answers again", cause)

    async def _answers_again(self) -> bool:
        """Probe Redis when the back-off allows and no other request is probing; True once it answers."""
        if self._probing or self._clock.monotonic() < self._probe_at:
            return False
        self._probing = True
        try:
            answered = await self._shared.ping(self._probe_timeout_s)
        finally:
            self._probing = False
        if not answered:
            self._probe_at = self._clock.monotonic() + self._probe_interval_s
            return False
        self._up = True
        log.warning("quota store answers again: quotas are shared through it")
        if self._pending and (self._settling is None or self._settling.done()):
            # In the background: the request that probed should not wait for thousands of round trips.
            self._settling = asyncio.create_task(self._settle_pending())
        return True

    async def _settle_pending(self) -> None:
        while self._pending and self._up:
            reservation, used = self._pending.popleft()
            async with self._gate:
                try:
                    await self._shared.settle(reservation, used)
                except QuotaStoreUnavailable as exc:
                    self._pending.appendleft((reservation, used))
                    self._went_down(exc)
