"""session-affinity: keep a session on one replica, by consistent hashing with bounded load.

Each candidate owns ``vnodes`` points on a hash ring. A request carrying a session id (the header named by
``gateway.sessionHeader``) walks the ring clockwise from hash(session id) and takes the first replica whose
gateway in-flight count is below ceil(``loadFactor`` x (total in-flight + 1) / candidates); that replica
scores 1, the others 0. While a replica stays in rotation and under the bound its sessions stay on it; when it
leaves, only its own sessions move (to the next replica on the ring). Requests without a session id score 0
everywhere, leaving the decision to the other scorers.

It is an affinity scorer: with ``p2c`` the session's replica is always one of the two candidates (unless over the
picker's own load bound), with ``max-score`` it wins outright. Give it a weight above the sum of the other
scorers' weights so the session's replica wins that comparison whenever it is within the bounds.

Parameters: ``loadFactor`` (>= 1, default 1.25), ``vnodes`` (>= 1, default 64).

Example: ``scorers: [{name: session-affinity, weight: 5, params: {loadFactor: 1.25}}]``
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, RequestInfo, Scorer

__all__ = ["SessionAffinity"]


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class SessionAffinity(Scorer, name="session-affinity"):
    affinity = True

    class Params(PluginParams):
        load_factor: float = Field(default=1.25, ge=1.0)
        """A replica takes a session while under this multiple of the mean in-flight count."""
        vnodes: int = Field(default=64, ge=1)
        """Points per replica on the hash ring."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        self.load_factor = params.load_factor
        self.vnodes = params.vnodes
        self._ring_ids: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def _ring(self, ids: tuple[str, ...]) -> None:
        if ids == self._ring_ids:
            return
        ring = sorted((_point(f"{rid}#{v}"), rid) for rid in ids for v in range(self.vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [rid for _, rid in ring]
        self._ring_ids = ids

    def owner(self, endpoints: Sequence[EndpointView], session_id: str) -> str:
        """The replica id the session maps to among ``endpoints`` (non-empty)."""
        self._ring(tuple(sorted(e.id for e in endpoints)))
        load = {e.id: e.in_flight for e in endpoints}
        bound = math.ceil(self.load_factor * (sum(load.values()) + 1) / len(endpoints))
        start = bisect.bisect(self._points, _point(session_id))
        n = len(self._points)
        for step in range(n):
            rid = self._owners[(start + step) % n]
            if load[rid] < bound:
                return rid
        return self._owners[start % n]

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        if not request.session_id:
            return [0.0] * len(endpoints)
        chosen = self.owner(endpoints, request.session_id)
        return [1.0 if e.id == chosen else 0.0 for e in endpoints]
