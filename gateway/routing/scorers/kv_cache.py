"""kv-cache: prefer the replica whose engine holds the longest cached prefix of this prompt, by its KV events.

Where ``prefix-affinity`` guesses from where this gateway sent text before, this scorer reads what the engines
report: every block each engine caches or evicts (vLLM's ``--kv-events-config``, the pool's ``engine.kvEvents``),
kept in this gateway's own `gateway.routing.kv_index.KvIndex` by `gateway.kv_events`. Every gateway subscribes to
every replica of the pool, so all of them see the same blocks and score alike without sharing any state.

Score of a replica = leading full blocks of the request's prompt tokens (`RequestInfo.token_ids`: the pool's
tokenizer and chat template, as the engine renders them) that its engine holds / full blocks of the prompt, when
that share is at least ``minShare``, else 0: a short cached prefix of a long prompt saves little, and sending the
prompt after it to a busier replica costs more than it saves, so the load scorers decide such a request. The
score is the share of the prefill the replica is spared (``spares_prefill``), so p2c's load bound grows with it
(`gateway.routing.base.within_bound`).
A replica whose event stream is down (`stream_down`) scores 0: its entries were dropped when the stream broke,
and until it is back the load scorers decide for it. A request without token ids (the pool has no tokenizer)
scores 0 everywhere.

It is an affinity scorer: ``p2c`` always draws the replica it prefers, within the picker's load bound, so a cached
prefix never piles requests onto an overloaded replica.

Parameters: ``blockSize`` (unset: learned from the engines' events, `gateway.routing.kv_index`; set: pinned to
that ``--block-size``, and events of another size are skipped and counted), ``minShare`` (0.5, in [0, 1]). Until
the size is learned (no block indexed yet) every replica scores 0.

Example: ``scorers: [{name: kv-cache, weight: 2}]``
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, RequestInfo, Scorer
from gateway.routing.kv_index import KvIndex, request_keys

__all__ = ["KvCache", "held_share"]


def held_share(held: int, blocks: int, min_share: float) -> float:
    """``held`` of ``blocks`` leading blocks as a share, 0 below ``min_share``."""
    share = held / blocks
    return share if share >= min_share else 0.0


class KvCache(Scorer, name="kv-cache"):
    affinity = True
    spares_prefill = True

    class Params(PluginParams):
        block_size: int | None = Field(default=None, ge=1, le=1024)
        """Tokens per KV block, pinned (the engines' ``--block-size``: events of another size are skipped). Unset:
        learned from the engines' events (vLLM's default is 16 on GPUs, 128 on the CPU)."""
        min_share: float = Field(default=0.5, ge=0.0, le=1.0)
        """The least share of the prompt a replica must hold for its cache to count (below: score 0)."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        self.index = KvIndex(block_size=params.block_size)
        self.min_share = params.min_share
        self.stream_down: set[str] = set()  # replicas whose event stream is cut (`gateway.kv_events`)
        self.scored = 0  # requests scored with token ids
        self.hit_blocks = 0  # leading blocks the chosen replica held, summed over them
        self.prompt_blocks = 0  # full prompt blocks, summed over them
        self._last: tuple[str, int | None, list[int]] = ("", None, [])  # request id, block size, keys
        self._matched: tuple[str, dict[str, int]] = ("", {})  # score()'s counts, for observe() of the request

    def _keys(self, request: RequestInfo) -> list[int]:
        """The request's keys in the index's block size; none while the size is not learned (nothing is held)."""
        size = self.index.block_size
        if size is None:
            return []
        if self._last[:2] != (request.request_id, size):  # score() and observe() of one request hash once
            tokens = request.token_ids or ()
            self._last = (request.request_id, size, request_keys(tokens, size, request.adapter, request.cache_salt))
        return self._last[2]

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        keys = self._keys(request)
        if not keys:
            return [0.0] * len(endpoints)
        live = [e.id for e in endpoints if e.id not in self.stream_down]
        matched = self.index.matched(keys, live)
        self._matched = (request.request_id, matched)
        return [held_share(matched.get(e.id, 0), len(keys), self.min_share) for e in endpoints]

    def observe(self, request: RequestInfo, chosen: EndpointView) -> None:
        """Count the blocks the chosen replica held (the gateway's predicted hit rate, `hit_rate`)."""
        keys = self._keys(request)
        if not keys:
            return
        if self._matched[0] != request.request_id:  # one candidate: the router did not score
            down = chosen.id in self.stream_down
            self._matched = (request.request_id, {} if down else self.index.matched(keys, [chosen.id]))
        self.scored += 1
        self.prompt_blocks += len(keys)
        self.hit_blocks += self._matched[1].get(chosen.id, 0)

    def hit_rate(self) -> float:
        """Share of the scored requests' full prompt blocks their chosen replica held when chosen."""
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0
