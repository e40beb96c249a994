"""rendezvous-affinity: the same replica for the same conversation from every gateway, with no shared index.

Type: scorer (affinity). What it does: a request's affinity key is its session id (the ``gateway.sessionHeader``
value) when it has one, else its prompt's first ``keyBlocks`` complete blocks of ``blockChars`` characters (fewer
when the prompt is shorter; a prompt shorter than one block has no key and scores 0 everywhere). Every candidate
gets the weight w(r) = blake2b(key digest, replica id) (highest random weight, "rendezvous" hashing); in
decreasing weight order, the first replica within the load bound is the winner and scores 1, the replicas within
the bound after it score ``decay`` ** k (k = 1, 2, ... in that order), and replicas over the bound score 0.

Load bound (consistent hashing with bounded loads): a replica is within it while its load is at most
``loadFactor`` x the candidates' mean load + 1; load is `endpoint_load` (the larger of this gateway's in-flight
count and the engine's running + waiting). The +1 keeps a nearly idle fleet sticky while a gauge still counts the
conversation's previous request. An overloaded winner is skipped for the next replica in rendezvous order, so
overflow also lands on the same replica from every gateway (as far as their load views agree), and the
conversation returns once the load falls.

Why it agrees across gateways: the weight depends only on the key and the replica's stable id (a pod name, or
``<pool>-static-<i>``), never on endpoint order, process, history or Python's per-process salted ``hash()``.
Removing a replica moves only the keys it was winning (each to its next replica in order); adding one takes
about 1/n of the keys, from every replica alike. The in-process `prefix-affinity` index learns where a prefix went
and so differs between gateways; this scorer needs no learning and no shared state, at the price of not noticing
that some other replica happens to hold a prefix too.

Why a scorer and not a picker: it composes with the load scorers and with either picker. ``p2c`` always draws the
highest-affinity candidate (the winner) and keeps its own load bound; ``max-score`` honours it outright. A request
without a key falls through to the other scorers unchanged, which a picker would have to reimplement. The price is
a weight rule: the winner beats every other candidate when its weight x (1 - ``decay``) exceeds the sum of the
other scorers' weights (e.g. 5 x 0.75 > 2 + 1), which is what makes the choice the same on every gateway.

Inputs: ``RequestInfo.session_id``, ``RequestInfo.prompt``, the candidates' ids and load gauges.
Parameters: ``blockChars`` (256), ``keyBlocks`` (4), ``loadFactor`` (>= 1, default 1.25), ``decay`` (in [0, 1),
default 0.25).

Example: ``scorers: [{name: queue-depth, weight: 2}, {name: kv-usage}, {name: rendezvous-affinity, weight: 5}]``
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, RequestInfo, Scorer, endpoint_load

__all__ = ["RendezvousAffinity", "affinity_key", "rendezvous_order", "winner", "within_load_bound"]


def affinity_key(request: RequestInfo, block_chars: int, key_blocks: int) -> bytes | None:
    """The digest routing keys on: the session id's, else the prompt's leading complete blocks'; None for neither."""
    if request.session_id:
        return hashlib.blake2b(b"session\0" + request.session_id.encode(), digest_size=16).digest()
    blocks = min(key_blocks, len(request.prompt) // block_chars)
    if blocks == 0:
        return None
    prefix = request.prompt[: blocks * block_chars].encode("utf-8", "surrogatepass")
    if request.cache_salt:  # an engine caches each salt's prefixes apart: one tenant's prefix is another's miss
        prefix = b"salt\0" + request.cache_salt.encode() + b"\0" + prefix
    return hashlib.blake2b(b"prefix\0" + prefix, digest_size=16).digest()


def _weight(key: bytes, replica_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + replica_id.encode(), digest_size=8).digest(), "big")


def rendezvous_order(key: bytes, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` by decreasing rendezvous weight for ``key`` (ties, practically never: by id)."""
    return sorted(replica_ids, key=lambda rid: (-_weight(key, rid), rid))


def within_load_bound(endpoints: Sequence[EndpointView], load_factor: float) -> dict[str, bool]:
    """Per replica id: whether it may take this request, load <= load_factor x the candidates' mean load + 1.

    The same bound as p2c's on its anchor (`gateway.routing.base.within_bound`), so with equal load factors p2c
    never drops a winner this scorer chose. The least loaded replica always fits (its load is at most the mean).
    """
    loads = {e.id: endpoint_load(e) for e in endpoints}
    bound = load_factor * sum(loads.values()) / len(loads) + 1.0
    return {rid: load <= bound for rid, load in loads.items()}


def winner(endpoints: Sequence[EndpointView], key: bytes, load_factor: float) -> str:
    """The replica id the key lands on among ``endpoints`` (non-empty): the first within the bound in rendezvous
    order."""
    fits = within_load_bound(endpoints, load_factor)
    return next(rid for rid in rendezvous_order(key, [e.id for e in endpoints]) if fits[rid])


class RendezvousAffinity(Scorer, name="rendezvous-affinity"):
    affinity = True

    class Params(PluginParams):
        block_chars: int = Field(default=256, ge=1)
        """Characters per prefix block."""
        key_blocks: int = Field(default=4, ge=1)
        """Leading prefix blocks that make the key (a conversation's later turns share them)."""
        load_factor: float = Field(default=1.25, ge=1.0)
        """A replica is skipped while its load exceeds this multiple of the candidates' mean load + 1."""
        decay: float = Field(default=0.25, ge=0.0, lt=1.0)
        """Score of the k-th replica after the winner within the bound: decay ** k."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        self.block_chars = params.block_chars
        self.key_blocks = params.key_blocks
        self.load_factor = params.load_factor
        self.decay = params.decay

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        key = affinity_key(request, self.block_chars, self.key_blocks)
        if key is None or not endpoints:
            return [0.0] * len(endpoints)
        fits = within_load_bound(endpoints, self.load_factor)
        scores: dict[str, float] = {}
        value = 1.0
        for rid in rendezvous_order(key, [e.id for e in endpoints]):
            if fits[rid]:
                scores[rid] = value
                value *= self.decay
        return [scores.get(e.id, 0.0) for e in endpoints]
