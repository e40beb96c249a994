"""Routing: filter -> score -> pick plugins over endpoint snapshots (see `gateway.routing.base`)."""

from __future__ import annotations

from gateway.routing.base import Decision, EndpointView, RequestInfo, Router, Scored

__all__ = ["Decision", "EndpointView", "RequestInfo", "Router", "Scored"]
