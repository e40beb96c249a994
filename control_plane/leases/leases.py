"""LeaseTable: restart-window leases, at most ``maxUnavailable`` holders per pool at any moment.

An agent asks for a lease before a planned restart and releases it when it is serving again. Leases expire at
an absolute time (grant time + TTL, on the control plane's wall clock) so a holder that died frees its slot.
Every grant, renewal, release, expiry, refusal and restore is kept in ``history`` (bounded, in memory), which
lets tests and operators check that no two restarts overlapped.

    acquire(pool, replica, now, ttl) -> LeaseGrant     holder added (or renewed if it already holds one)
                                     -> LeaseRefused   pool already has maxUnavailable other holders
    release(pool, replica, now) -> bool                False when it held no lease

Those two decide in memory. The control plane calls their durable forms, which also keep the pool's holders in
a `control_plane.leases.stores.LeaseStore` so that a restarted control plane still knows them:

    restore(now)                  load the store's unexpired leases (before serving; again on the next lease
                                  call if the store could not be read)
    acquire_and_save(...)         acquire, then write the pool's holders; a failed write undoes the grant and
                                  raises LeaseStoreError (no lease is granted that a restart could forget)
    release_and_save(...)         release, then write; a failed write is logged: the lease stays in the store
                                  until it expires (the conservative side) and the next write of the pool fixes it

Calls for one pool are serialised, so a write that fails undoes only its own change.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from control_plane.leases.stores import LeaseStore, LeaseStoreError, MemoryLeaseStore
from fleet.protocol.wire import LeaseGrant

__all__ = ["LeaseRefused", "LeaseStoreError", "LeaseTable"]

log = logging.getLogger("llmfleet.autoscaler.leases")


@dataclass(frozen=True)
class LeaseRefused:
    pool: str
    replica: str
    holders: list[str]
    max_unavailable: int


class LeaseTable:
    def __init__(
        self,
        max_unavailable: Callable[[str], int],
        default_ttl_s: float,
        history: int = 1000,
        store: LeaseStore | None = None,
    ) -> None:
        self._max = max_unavailable
        self.default_ttl_s = default_ttl_s
        self.store = store or MemoryLeaseStore()
        self._leases: dict[str, dict[str, float]] = {}  # pool -> replica -> expires_at
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        self.restored = isinstance(self.store, MemoryLeaseStore)  # nothing to load from memory
        self._locks: dict[str, asyncio.Lock] = {}

    def _log(self, event: str, pool: str, replica: str, now: float, **extra: Any) -> None:
        self.history.append({"at": now, "event": event, "pool": pool, "replica": replica, **extra})

    def _expire(self, pool: str, now: float) -> dict[str, float]:
        held = self._leases.setdefault(pool, {})
        for replica, expires in list(held.items()):
            if expires <= now:
                del held[replica]
                self._log("expire", pool, replica, now)
        return held

    def holders(self, pool: str, now: float) -> list[str]:
        return sorted(self._expire(pool, now))

    def acquire(self, pool: str, replica: str, now: float, ttl_s: float | None = None) -> LeaseGrant | LeaseRefused:
        held = self._expire(pool, now)
        limit = self._max(pool)
        if replica not in held and len(held) >= limit:
            self._log("refuse", pool, replica, now, holders=sorted(held))
            return LeaseRefused(pool, replica, sorted(held), limit)
        event = "renew" if replica in held else "grant"
        held[replica] = now + (ttl_s if ttl_s is not None else self.default_ttl_s)
        self._log(event, pool, replica, now, holders=sorted(held))
        return LeaseGrant(pool=pool, replica=replica, expires_at=held[replica], holders=sorted(held))

    def release(self, pool: str, replica: str, now: float) -> bool:
        held = self._expire(pool, now)
        if held.pop(replica, None) is None:
            return False
        self._log("release", pool, replica, now, holders=sorted(held))
        return True

    def snapshot(self, now: float) -> dict[str, Any]:
        return {
            "holders": {pool: {r: exp for r, exp in sorted(self._expire(pool, now).items())} for pool in self._leases},
            "history": list(self.history),
        }

    # -- durable forms (see the module docstring)

    async def restore(self, now: float) -> int:
        """Take the store's unexpired leases as the current holders; returns how many. LeaseStoreError when the
        store cannot be read (then `restored` stays False and the next lease call tries again)."""
        loaded = await self.store.load()
        count = 0
        for pool, held in loaded.items():
            for replica, expires_at in held.items():
                if expires_at > now:
                    self._leases.setdefault(pool, {})[replica] = expires_at
                    self._log("restore", pool, replica, now, expires_at=expires_at)
                    count += 1
        self.restored = True
        return count

    def _lock(self, pool: str) -> asyncio.Lock:
        return self._locks.setdefault(pool, asyncio.Lock())

    async def acquire_and_save(
        self, pool: str, replica: str, now: float, ttl_s: float | None = None
    ) -> LeaseGrant | LeaseRefused:
        async with self._lock(pool):
            if not self.restored:
                await self.restore(now)
            before = dict(self._expire(pool, now))
            result = self.acquire(pool, replica, now, ttl_s)
            if isinstance(result, LeaseGrant):
                try:
                    await self.store.put(pool, self._leases[pool], now)
                except LeaseStoreError:
                    self._leases[pool] = before
                    self._log("unsaved", pool, replica, now)
                    raise
            return result

    async def release_and_save(self, pool: str, replica: str, now: float) -> bool:
        async with self._lock(pool):
            if not self.restored:
                await self.restore(now)
            released = self.release(pool, replica, now)
            if released:
                try:
                    await self.store.put(pool, self._leases[pool], now)
                except LeaseStoreError as exc:
                    log.warning(
                        "lease of %s/%s released but not saved (%s): it stays stored until it expires",
                        pool,
                        replica,
                        exc,
                    )
            return released
