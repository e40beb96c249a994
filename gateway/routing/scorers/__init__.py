"""Routing scorers: ``REGISTRY`` maps each scorer's name to its class."""

from __future__ import annotations

from gateway.routing.base import SCORERS as REGISTRY
from gateway.routing.scorers import (
    adapter as adapter,
    kv_cache as kv_cache,
    load as load,
    prefix as prefix,
    rendezvous as rendezvous,
    session as session,
)

__all__ = ["REGISTRY"]
