"""Routing filters: ``REGISTRY`` maps each filter's name to its class."""

from __future__ import annotations

from gateway.routing.base import FILTERS as REGISTRY
from gateway.routing.filters import adapter as adapter, health as health, model as model

__all__ = ["REGISTRY"]
