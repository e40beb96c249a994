"""adapter-affinity: prefer the replicas where the request's LoRA adapter is already on the GPU.

Score 1 for a replica whose last scrape names the adapter among its running or waiting requests
(``vllm:lora_requests_info``), or to which this gateway sent a request for it within ``residentS`` seconds
(an idle adapter stays in its GPU slot until others push it out, and vLLM does not export idle ones); else 0.
Requests for the base model score 0 everywhere. Sending an adapter where it is resident saves its load (read
from disk, or copied from host memory) in the request's TTFT and keeps the other replicas' slots for other
adapters.

An affinity scorer, like prefix-affinity: p2c keeps a resident replica among its two candidates while it is
within the load bound.

Parameters: ``residentS`` (> 0, default 60).

Example: ``scorers: [{name: adapter-affinity, weight: 2}]`` (in the defaults, weight 1)
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, RequestInfo, Scorer

__all__ = ["AdapterAffinity"]


class AdapterAffinity(Scorer, name="adapter-affinity"):
    affinity = True

    class Params(PluginParams):
        resident_s: float = Field(default=60.0, gt=0, le=3600)
        """How long after this gateway's last request for an adapter a replica is taken to still hold it."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params or self.Params()
        self._sent: dict[tuple[str, str], float] = {}  # (replica id, adapter) -> when this gateway last sent it

    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        adapter = request.adapter
        if adapter is None:
            return [0.0] * len(endpoints)
        horizon = request.now - self.params.resident_s
        return [
            1.0 if adapter in e.active_adapters or self._sent.get((e.id, adapter), -1e18) >= horizon else 0.0
            for e in endpoints
        ]

    def observe(self, request: RequestInfo, chosen: EndpointView) -> None:
        if request.adapter is None:
            return
        self._sent[(chosen.id, request.adapter)] = request.now
        if len(self._sent) > 4096:  # forget the oldest: replicas come and go
            horizon = request.now - self.params.resident_s
            self._sent = {k: t for k, t in self._sent.items() if t >= horizon}
