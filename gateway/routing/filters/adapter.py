"""serves-adapter: keep the replicas whose engine serves the LoRA adapter the request names.

A request for an adapter (its ``model`` is one of the pool's ``adapters``) may only go to a replica whose engine
lists it in ``/v1/models``: while a pool rolls out a new adapter, replicas started before it lack it. Requests for
the base model pass every replica. When no replica serves the adapter the set is empty and the request is
answered 503 (no ready replica), as for a pool without replicas.

Example: ``filters: [{name: ready}, {name: serves-model}, {name: serves-adapter}]`` (in the defaults)
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import EndpointView, Filter, RequestInfo

__all__ = ["ServesAdapter"]


class ServesAdapter(Filter, name="serves-adapter"):
    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
        if request.adapter is None:
            return endpoints
        return [e for e in endpoints if request.adapter in e.adapters]
