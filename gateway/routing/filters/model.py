"""serves-model: keep replicas whose served model name is the one requested.

Example: ``filters: [{name: serves-model}]``
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import EndpointView, Filter, RequestInfo

__all__ = ["ServesModel"]


class ServesModel(Filter, name="serves-model"):
    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
        return [e for e in endpoints if e.model == request.model]
