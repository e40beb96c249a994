"""Routing: filter -> score -> pick plugins over endpoint snapshots (see `gateway.routing.base`).

``REGISTRIES`` holds the three routing registries with every shipped plugin registered: a command that loads
a stack for a gateway passes them to the loader so plugin names and parameters are checked at load.
"""

from __future__ import annotations

from gateway.routing import filters, pickers, scorers
from gateway.routing.base import FILTERS, PICKERS, SCORERS, Decision, EndpointView, RequestInfo, Router, Scored

__all__ = ["REGISTRIES", "Decision", "EndpointView", "RequestInfo", "Router", "Scored"]

REGISTRIES = (FILTERS, SCORERS, PICKERS)

del filters, pickers, scorers  # imported for their registrations
