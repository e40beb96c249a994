"""p2c: power of two choices.

Algorithm: draw two distinct candidates uniformly at random and keep the one with the higher total score (a tie
goes to either at random). Compared with always taking the best score, it avoids the herd effect of many
requests (or many gateways) seeing the same stale metrics and piling onto one replica; compared with random, the
most loaded replica is chosen only when both draws hit replicas at least as loaded, so the busiest one of n
gets almost nothing while others have room. With one candidate it returns it.

Affinity scorers need a deterministic picker: use ``max-score`` when session stickiness matters.

Example: ``picker: {name: p2c, params: {seed: 7}}``
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import EndpointView, Picker, RequestInfo, Scored

__all__ = ["PowerOfTwoChoices"]


class PowerOfTwoChoices(Picker, name="p2c"):
    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        del request  # Unused.
        if len(candidates) == 1:
            return candidates[0].endpoint
        a, b = self.rng.sample(range(len(candidates)), 2)
        first, second = candidates[a], candidates[b]
        if first.score == second.score:
            return first.endpoint  # both indices were drawn at random: either is a fair tie-break
        return first.endpoint if first.score > second.score else second.endpoint
