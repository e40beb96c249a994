"""Aliases: one model name served by several pools by weight, sticky per session, with a fallback pool.

Type: model resolution, before routing (a request for an alias becomes a request for one pool, whose router
then picks a replica). What it does: each pool p of positive weight w(p) gets the score
s(p) = -ln(u(key, p)) / w(p), where u is blake2b(key digest, pool name) mapped into (0, 1); the pool with the
lowest score is the choice ("weighted rendezvous": s(p) is exponential with rate w(p), so the lowest is p with
probability w(p) / sum(w)). The key is the one `rendezvous-affinity` keys replicas on (`affinity_key`: the
session header's value, else the prompt's leading blocks), so a conversation keeps its pool as it keeps its
replica; a request without one, or every request of an alias with ``sticky: none``, keys on its request id.

Why this scheme: the choice depends only on the key, the pool names and the weights, never on a process, an
order or Python's salted ``hash()``, so every gateway replica makes the same one. Changing weights moves only
the sessions it must: raising w(p) lowers s(p) alone, so sessions move to p and none leave it; removing a pool
moves only its own sessions, each to its next pool in score order.

Fallback: `WeightedAlias.candidates` lists the choice, then the fallback pool, then the other weighted pools in
score order; `AliasTable.resolve` takes the first with a ready replica, and the choice when none has one (the
caller's usual 503, or its wait for a pool scaling up). Weight-0 pools are never candidates: 0 turns a pool off.

`AliasTable` is a frozen value: the gateway holds one and swaps it whole (`gateway.models.Models.set_aliases`),
so a table from the control plane can replace the stack's at runtime without touching routing.

Example: ``aliases: {chat: {pools: {qwen-v1: 95, qwen-v2: 5}, fallback: qwen-small, sticky: session}}``
"""

from __future__ import annotations

import hashlib
import math
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from fleet.spec.stack import AliasSpec
from gateway.routing.base import RequestInfo
from gateway.routing.scorers.rendezvous import RendezvousAffinity, affinity_key

__all__ = ["AliasTable", "WeightedAlias", "alias_key", "weighted_order"]

_KEY_PARAMS = RendezvousAffinity.Params()  # the blocks a conversation's replica is keyed on key its pool too


def alias_key(request: RequestInfo, sticky: bool) -> bytes:
    """The digest an alias's choice keys on: `affinity_key` when ``sticky`` and it has one, else the request id's."""
    if sticky:
        key = affinity_key(request, _KEY_PARAMS.block_chars, _KEY_PARAMS.key_blocks)
        if key is not None:
            return key
    return hashlib.blake2b(b"request\0" + request.request_id.encode(), digest_size=16).digest()


def _score(key: bytes, pool: str, weight: int) -> float:
    digest = hashlib.blake2b(key + b"\0" + pool.encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / 2.0**64  # in (0, 1): the log below is finite
    return -math.log(unit) / weight


def weighted_order(key: bytes, weights: Mapping[str, int]) -> list[str]:
    """The pools of positive weight by increasing score for ``key``: the first is the choice (ties: by name)."""
    return sorted((p for p, w in weights.items() if w > 0), key=lambda p: (_score(key, p, weights[p]), p))


@dataclass(frozen=True)
class WeightedAlias:
    """One alias: pool name -> weight (non-negative integers, positive sum), a fallback pool outside them or None,
    and whether the choice sticks to a session. ValueError when any of that does not hold."""

    name: str
    weights: Mapping[str, int]
    fallback: str | None = None
    sticky: bool = True

    def __post_init__(self) -> None:
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in self.weights.values()):
            raise ValueError(f"alias {self.name!r}: weights must be non-negative integers, got {dict(self.weights)}")
        if sum(self.weights.values()) <= 0:
            raise ValueError(f"alias {self.name!r}: the weights sum to 0")
        if self.fallback is not None and self.fallback in self.weights:
            raise ValueError(f"alias {self.name!r}: the fallback {self.fallback!r} is one of its weighted pools")
        object.__setattr__(self, "weights", types.MappingProxyType(dict(self.weights)))

    @property
    def pools(self) -> list[str]:
        """Every pool the alias may send a request to: the weighted ones, then the fallback."""
        return [*self.weights, *([self.fallback] if self.fallback else [])]

    def candidates(self, key: bytes) -> list[str]:
        """The pools to try for ``key``, in order: the weighted choice, the fallback, the other weighted pools."""
        ranked = weighted_order(key, self.weights)
        return [ranked[0], *([self.fallback] if self.fallback else []), *ranked[1:]]


@dataclass(frozen=True)
class AliasTable:
    """Every alias of a gateway by name; immutable, replaced whole."""

    aliases: Mapping[str, WeightedAlias] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", types.MappingProxyType(dict(self.aliases)))

    @classmethod
    def from_spec(cls, aliases: Mapping[str, AliasSpec]) -> AliasTable:
        """The table a stack's ``aliases`` section declares (checked by `fleet.spec.validate` beforehand)."""
        return cls(
            {
                name: WeightedAlias(name, dict(spec.pools), spec.fallback, spec.sticky == "session")
                for name, spec in aliases.items()
            }
        )

    def __iter__(self) -> Iterator[WeightedAlias]:
        return iter(self.aliases.values())

    def get(self, name: str) -> WeightedAlias | None:
        return self.aliases.get(name)

    def resolve(self, alias: WeightedAlias, request: RequestInfo, ready: Callable[[str], bool]) -> str:
        """The pool that serves ``request`` for ``alias``: the first candidate ``ready`` says has a ready replica,
        else the weighted choice."""
        candidates = alias.candidates(alias_key(request, alias.sticky))
        return next((pool for pool in candidates if ready(pool)), candidates[0])
