"""LeaseTable: restart-window leases, at most ``maxUnavailable`` holders per pool at any moment.

An agent asks for a lease before a planned restart and releases it when it is serving again. Leases expire
after their TTL so a holder that died frees its slot. Every grant, renewal, release, expiry and refusal is kept
in ``history`` (bounded), which lets tests and operators check that no two restarts overlapped.

    acquire(pool, replica, ttl) -> LeaseGrant      holder added (or renewed if it already holds one)
                                -> LeaseRefused     pool already has maxUnavailable other holders
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.wire import LeaseGrant

__all__ = ["LeaseRefused", "LeaseTable"]


@dataclass(frozen=True)
class LeaseRefused:
    pool: str
    replica: str
    holders: list[str]
    max_unavailable: int


class LeaseTable:
    def __init__(self, max_unavailable: Callable[[str], int], default_ttl_s: float, history: int = 1000) -> None:
        self._max = max_unavailable
        self.default_ttl_s = default_ttl_s
        self._leases: dict[str, dict[str, float]] = {}  # pool -> replica -> expires_at
        self.history: deque[dict[str, Any]] = deque(maxlen=history)

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
