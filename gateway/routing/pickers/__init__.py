"""Routing pickers: ``REGISTRY`` maps each picker's name to its class."""

from __future__ import annotations

from gateway.routing.base import PICKERS as REGISTRY
from gateway.routing.pickers import least_work as least_work, p2c as p2c, simple as simple

__all__ = ["REGISTRY"]
