"""Simple pickers: max-score, random, round-robin.

* ``max-score``: the highest total score; ties broken uniformly at random (so equal replicas share load).
* ``random``: uniform over the candidates, ignoring scores (the baseline p2c is measured against).
* ``round-robin``: cycles through the candidates in id order, ignoring scores.

Example: ``picker: {name: max-score}``
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import EndpointView, Picker, RequestInfo, Scored

__all__ = ["MaxScore", "RandomPick", "RoundRobin"]


class MaxScore(Picker, name="max-score"):
    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        del request  # Unused.
        best = max(c.score for c in candidates)
        top = [c.endpoint for c in candidates if c.score >= best]
        return top[0] if len(top) == 1 else self.rng.choice(top)


class RandomPick(Picker, name="random"):
    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        del request  # Unused.
        return self.rng.choice(candidates).endpoint


class RoundRobin(Picker, name="round-robin"):
    def __init__(self, params: Picker.Params | None = None) -> None:
        super().__init__(params)
        self._next = 0

    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        del request  # Unused.
        ordered = sorted(candidates, key=lambda c: c.endpoint.id)
        chosen = ordered[self._next % len(ordered)].endpoint
        self._next += 1
        return chosen
