"""Oracle KV scorer: each replica's real cached prefix of the prompt, read from its engine's prefix cache.

The yardstick of the ``kv-cache`` scorer (`gateway.routing.scorers.kv_cache`), which learns the same thing from the
engines' KV events after they travel to the gateway. This one reads each replica's scheduler at the moment of
routing: no events, no delay, no lost or skipped block.

Score of a replica = leading prompt blocks its prefix cache holds, exactly as the engine would take them on
admission (`engine_sim.kv.KVCacheManager.computed_blocks`: full 16-token blocks, capped at the prompt's length
less one token) / full blocks of the prompt, the ``kv-cache`` scorer's denominator, 0 below the same
``minShare`` (`gateway.routing.scorers.kv_cache.held_share`). A request without token ids, or a replica the
lookup does not know, scores 0. Like ``kv-cache`` it is an affinity scorer that spares prefill, so the ``p2c``
picker anchors on it within the same load bound, grown by the share spared.

Not a plugin a stack can name: it needs the simulation's replicas (``scheduler_of``, set by
`simulate.fleet_sim.FleetSim`), so it is taken out of the scorer registry once defined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine_sim.kv import BLOCK_SIZE
from engine_sim.scheduler import Scheduler
from gateway.routing.base import SCORERS, EndpointView, RequestInfo, Router, Scorer
from gateway.routing.scorers.kv_cache import held_share

__all__ = ["OracleKv", "bind_oracle", "cached_prefix_blocks", "prefix_cache_keys"]


def prefix_cache_keys(
    token_ids: Sequence[int], block_size: int = BLOCK_SIZE, cache_salt: str | None = None
) -> list[int]:
    """The keys the simulated engine's prefix cache files ``token_ids``'s full blocks under, sent with
    ``cache_salt`` (`engine_sim.kv`: ``hash((parent, tokens of the block))`` from parent 0, or from
    ``hash(("cache_salt", salt))`` for a salted request: another salt's blocks never match)."""
    keys: list[int] = []
    parent = hash(("cache_salt", cache_salt)) if cache_salt else 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


def cached_prefix_blocks(scheduler: Scheduler, keys: Sequence[int], num_tokens: int) -> int:
    """Leading blocks of a prompt of ``num_tokens`` tokens with ``keys`` that ``scheduler``'s cache would serve."""
    kv = scheduler.kv
    if not kv.pool.enable_caching:
        return 0
    matched = 0
    for key in keys[: (num_tokens - 1) // kv.block_size]:
        if kv.pool.lookup(key) is None:
            break
        matched += 1
    return matched


class OracleKv(Scorer, name="oracle-kv"):
    affinity = True
    spares_prefill = True

    def __init__(self, scheduler_of: Callable[[str], Scheduler | None] | None = None, min_share: float = 0.5) -> None:
        self.scheduler_of: Callable[[str], Scheduler | None] = scheduler_of or (lambda _: None)
        self.min_share = min_share
        self._last: tuple[str, list[int]] = ("", [])

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        tokens = request.token_ids or ()
        if self._last[0] != request.request_id:
            self._last = (request.request_id, prefix_cache_keys(tokens, cache_salt=request.cache_salt))
        keys = self._last[1]
        if not keys:
            return [0.0] * len(endpoints)
        scores = []
        for endpoint in endpoints:
            scheduler = self.scheduler_of(endpoint.id)
            held = 0 if scheduler is None else cached_prefix_blocks(scheduler, keys, len(tokens))
            scores.append(held_share(held, len(keys), self.min_share))
        return scores


SCORERS.unregister(OracleKv.name)  # a yardstick of the simulation, not a plugin a stack can name


def bind_oracle(router: Router, scheduler_of: Callable[[str], Scheduler | None]) -> None:
    """Give ``router``'s `OracleKv` scorers (if any) the replicas' schedulers, looked up by endpoint id."""
    for scorer, _ in router.scorers:
        if isinstance(scorer, OracleKv):
            scorer.scheduler_of = scheduler_of
