"""least-work: the replica where this request adds to the least work, counted in prompt tokens.

Cost of a candidate = the prompt tokens this gateway has sent it that it has not yet prefilled
(`EndpointView.prefill_tokens`) + the part of this request's prompt it would have to prefill, (1 - its
`Scored.spared`) x the prompt's tokens + ``decodeWeight`` x the prompt tokens its decoding requests hold
(`EndpointView.context_tokens`, what each decode step reads). The cheapest candidate wins; equal costs are broken
uniformly at random, so an idle fleet shares cold requests evenly.

Why tokens and not requests: a request whose prompt a replica holds costs it a few decode steps, a cold
30,000-token prompt seconds of prefill, and p2c's bound counts both as one. Choosing by tokens gives a replica
the cached requests it is cheapest for while the cold ones go where the queued prefill is shortest, so exact
cache state raises the hit rate without piling work onto the replicas that hold the hot prefixes (measured in
docs/operations.md, "KV-aware routing"). Dynamo's KV router has the same form, as its router docs give it:
cost = ``overlap_score_weight`` (default 1) x prefill blocks + decode blocks, the prefill counted until the first
output token and the decode until the request completes. Its default weighs a decode block as much as a prefill
block; here a decoding context token weighs 0.1 of a prompt token: on Mooncake at 8 replicas, with each engine's
exact queue, a weight of 1 held 44.2% of prompt tokens in cache against 51.7% at 0.1 (docs/benchmarks.md).

``spared`` comes from a scorer that knows what each engine holds (``kv-cache``); without one, or for a request
without token ids, no cache is counted and the cost is the queued work plus the whole prompt: least-loaded by
tokens. The prompt's tokens are counted from its token ids, else estimated from its characters
(`RequestInfo.prompt_tokens`), and so are those the gateway counts on each replica. The scorers' weighted scores are
not read. The counts are this gateway's own, exact and current: another gateway's requests are not in them, so
each gateway balances its own share of the traffic (Dynamo's router replicas can exchange theirs,
``--router-replica-sync``; gateways here share nothing).

Parameters: ``seed`` (ties, for tests), ``decodeWeight`` (0.1, in [0, 10]).
Example: ``picker: {name: least-work, params: {decodeWeight: 0.1}}``
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from gateway.routing.base import EndpointView, Picker, RequestInfo, Scored

__all__ = ["LeastWork", "work"]


def work(candidate: Scored, prompt_tokens: int, decode_weight: float) -> float:
    """The tokens ``candidate`` has to process if it takes a request of ``prompt_tokens``: its queued prefill,
    the request's uncached part there, and ``decode_weight`` x the context its decodes hold."""
    view = candidate.endpoint
    uncached = (1.0 - candidate.spared) * prompt_tokens
    return view.prefill_tokens + uncached + decode_weight * view.context_tokens


class LeastWork(Picker, name="least-work"):
    class Params(Picker.Params):
        decode_weight: float = Field(default=0.1, ge=0.0, le=10.0)
        """What one token of a decoding request's context costs against one prompt token to prefill."""

    def __init__(self, params: Params | None = None) -> None:
        params = params or self.Params()
        super().__init__(params)
        self.decode_weight = params.decode_weight

    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView:
        tokens = request.prompt_tokens
        costs = [work(c, tokens, self.decode_weight) for c in candidates]
        least = min(costs)
        cheapest = [c.endpoint for c, cost in zip(candidates, costs, strict=True) if cost <= least]
        return cheapest[0] if len(cheapest) == 1 else self.rng.choice(cheapest)
