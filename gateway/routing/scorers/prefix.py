"""prefix-affinity: prefer the replica that most recently served the longest run of this prompt's leading blocks.

The prompt text is cut into blocks of ``block_chars`` characters (at most ``max_blocks``); block i's key is
hash(key of block i-1, text of block i), from a root of the request's ``cache_salt`` (an engine caches each salt's
prefixes apart), so a key stands for the whole prefix up to it. After each routing
decision every key of the request points at the chosen replica, in an LRU index of at most ``capacity`` keys
(old prefixes are forgotten, memory stays bounded). Score of a replica = matched leading blocks / blocks
(the walk stops at the first block not owned by that replica). An engine with prefix caching then reuses the KV.
It is an affinity scorer: ``p2c`` always draws the replica it prefers, within the picker's load bound.

Parameters: ``blockChars`` (256), ``maxBlocks`` (64), ``capacity`` (65536), each >= 1.

Example: ``scorers: [{name: prefix-affinity, weight: 1, params: {blockChars: 256, capacity: 65536}}]``
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, RequestInfo, Scorer

__all__ = ["PrefixAffinity", "block_keys"]


def block_keys(text: str, block_chars: int, max_blocks: int, cache_salt: str | None = None) -> list[int]:
    """Chained hashes of the complete leading blocks of ``text``, sent with ``cache_salt``."""
    keys: list[int] = []
    previous = hash(("cache_salt", cache_salt)) if cache_salt else 0
    for i in range(min(max_blocks, len(text) // block_chars)):
        previous = hash((previous, text[i * block_chars : (i + 1) * block_chars]))
        keys.append(previous)
    return keys


class PrefixAffinity(Scorer, name="prefix-affinity"):
    affinity = True

    class Params(PluginParams):
        block_chars: int = Field(default=256, ge=1)
        """Characters per prefix block."""
        max_blocks: int = Field(default=64, ge=1)
        """Leading blocks hashed per request."""
        capacity: int = Field(default=65536, ge=1)
        """Prefix keys remembered (LRU)."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        self.block_chars = params.block_chars
        self.max_blocks = params.max_blocks
        self.capacity = params.capacity
        self._index: OrderedDict[int, str] = OrderedDict()
        self._last: tuple[str, list[int]] = ("", [])

    def __len__(self) -> int:
        return len(self._index)

    def _keys(self, request: RequestInfo) -> list[int]:
        if self._last[0] != request.request_id:  # score() and observe() of one request hash once
            keys = block_keys(request.prompt, self.block_chars, self.max_blocks, request.cache_salt)
            self._last = (request.request_id, keys)
        return self._last[1]

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        keys = self._keys(request)
        if not keys:
            return [0.0] * len(endpoints)
        owners = [self._index.get(key) for key in keys]
        scores = []
        for endpoint in endpoints:
            matched = 0
            for owner in owners:
                if owner != endpoint.id:
                    break
                matched += 1
            scores.append(matched / len(keys))
        return scores

    def observe(self, request: RequestInfo, chosen: EndpointView) -> None:
        for key in self._keys(request):
            self._index[key] = chosen.id
            self._index.move_to_end(key)
        while len(self._index) > self.capacity:
            self._index.popitem(last=False)
