"""Departures: which of a pool's replicas died (rather than being scaled in), so each is replaced exactly once.

    observe(previous, replicas, now, window_s) -> Departures      one tick's view folded into the last one's
    Departures.expect(victims, now) -> Departures                 replicas the loop itself removes next

A replica *dies* when it served or was starting at the last tick (a fresh report, `_SERVING`) and at
this one is gone from the pool's replicas (the actuator no longer runs it: an agent SIGKILLed, a pod deleted) or its
report went stale (its agent stopped reporting), without the loop having chosen it as a scale-down victim. The
scaler sees the capacity drop and launches one replacement, which counts as capacity on its way while it starts
(`control_plane.scaling.context.ARRIVING_STATES`). A death is remembered for ``window_s`` (the pool's cold start,
plus a node's where one is needed: the time the replacement takes to serve), and while it is, the pool does not
shrink (`control_plane.scaling.slo_priority.availability`): otherwise a policy whose number dipped would scale the
starting replacement in (it is the cheapest victim, nothing to drain), capacity would drop again, and a second
replacement would be launched for the same death.

Pure: the loop carries the value from tick to tick and passes ``replacing`` into the scaling context.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from control_plane.scaling.context import ARRIVING_STATES, ReplicaLoad
from fleet.protocol.wire import ReplicaState

__all__ = ["Departures", "observe"]

# States of a replica that serves or will, with a report of its own (a ``launching`` one has none yet, and the
# placeholders of an actuator that cannot name its replicas are launching): one that was in these and vanishes
# without being removed has died.
_SERVING = (ARRIVING_STATES - {ReplicaState.LAUNCHING}) | {ReplicaState.READY}


@dataclass(frozen=True)
class Departures:
    """One pool's serving replicas at the last tick, its recent deaths and the victims it is removing."""

    serving: frozenset[str] = frozenset()
    dead: tuple[tuple[str, float], ...] = ()  # (replica, died at), oldest first
    removing: tuple[tuple[str, float], ...] = ()  # (replica, chosen at): victims, whose departure is no death

    @property
    def replacing(self) -> tuple[str, ...]:
        """The replicas that died within the window: a replacement for each is launched or on its way."""
        return tuple(r for r, _ in self.dead)

    def expect(self, victims: Iterable[str], now: float) -> Departures:
        """These departures, knowing the loop is about to remove ``victims`` (scale-down, sleep)."""
        known = {r for r, _ in self.removing}
        added = tuple((r, now) for r in victims if r not in known)
        return Departures(self.serving, self.dead, self.removing + added)


def observe(previous: Departures, replicas: tuple[ReplicaLoad, ...], now: float, window_s: float) -> Departures:
    """``previous`` advanced to this tick's ``replicas`` (see the module docstring)."""
    present = {r.replica: r for r in replicas}
    removing = tuple((r, at) for r, at in previous.removing if now - at <= window_s)
    removed = {r for r, _ in removing}
    dead = [(r, at) for r, at in previous.dead if now - at <= window_s]
    known_dead = {r for r, _ in dead}
    for replica in sorted(previous.serving - removed - known_dead):
        now_seen = present.get(replica)
        if now_seen is None or now_seen.stale:
            dead.append((replica, now))
    serving = frozenset(r.replica for r in replicas if r.state in _SERVING and not r.stale)
    return Departures(serving, tuple(dead), removing)
