"""p2c: power of two choices, anchored on the affinity target.

Algorithm: draw two distinct candidates and keep the one with the higher total score. Compared with always
taking the best score, it avoids the herd effect of many requests (or many gateways) seeing the same stale
metrics and piling onto one replica; compared with random, the most loaded replica is chosen only when both draws
hit replicas at least as loaded, so the busiest one of n gets almost nothing while others have room. With one
candidate it returns it.

Affinity anchor: when affinity scorers (``session-affinity``, ``prefix-affinity``) give some candidate a positive
score, the one with the highest affinity (`gateway.routing.base.anchor`) is always the first of the two draws, the
second is drawn uniformly from the others, and a tie goes to the anchor (it holds the cached state). So a session
keeps landing on its replica instead of reaching it only when a random draw happens to include it. Bounded load:
the anchor is honoured only while its load (max of this gateway's in-flight count and the engine's running +
waiting) is at most ``loadFactor`` x the candidates' mean load + 1 (`gateway.routing.base.within_bound`), times
1 + the share of the prompt's prefill its cache spares when a scorer knows it (``kv-cache``: up to twice the
bound for a prompt it holds whole); above that it is left out of both draws for this request, so affinity never
piles requests onto an overloaded replica. Without affinity (no session id, no known prefix) both draws are
uniform, as in plain p2c.

Parameters: ``seed`` (random draws, for tests), ``loadFactor`` (>= 1, default 1.25).
Example: ``picker: {name: p2c, params: {loadFactor: 1.5}}``
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from gateway.routing.base import EndpointView, Picker, RequestInfo, Scored, anchor, within_bound

__all__ = ["PowerOfTwoChoices"]


class PowerOfTwoChoices(Picker, name="p2c"):
    class Params(Picker.Params):
        load_factor: float = Field(default=1.25, ge=1.0)
        """The affinity anchor is honoured while its load is at most this multiple of the mean + 1."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        super().__init__(params)
        self.load_factor = params.load_factor

    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        del request  # Unused.
        if len(candidates) == 1:
            return candidates[0].endpoint
        preferred = anchor(candidates)
        if preferred is not None:
            others = [c for c in candidates if c is not preferred]
            if not within_bound(preferred, candidates, self.load_factor):
                return self._two_choices(others)
            other = self.rng.choice(others)
            return other.endpoint if other.score > preferred.score else preferred.endpoint
        return self._two_choices(candidates)

    def _two_choices(self, candidates: Sequence[Scored]) -> EndpointView:
        if len(candidates) == 1:
            return candidates[0].endpoint
        a, b = self.rng.sample(range(len(candidates)), 2)
        first, second = candidates[a], candidates[b]
        if first.score == second.score:
            return first.endpoint  # both indices were drawn at random: either is a fair tie-break
        return first.endpoint if first.score > second.score else second.endpoint
