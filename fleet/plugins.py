"""Plugins: the registries of named plugins the fleet spec may refer to.

Each plugin point lives in its own runtime package and exposes a ``REGISTRY`` dict (name -> class) filled by
``__init_subclass__``. The spec validator imports the module lazily and checks names against it, so an
unknown name fails at config load with the list of valid ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

__all__ = ["PLUGIN_MODULES", "registered_names"]

# plugin kind -> module holding its REGISTRY
PLUGIN_MODULES: Mapping[str, str] = {
    "routing filter": "gateway.routing.filters",
    "routing scorer": "gateway.routing.scorers",
    "routing picker": "gateway.routing.pickers",
    "scaling policy": "autoscaler.policies",
    "actuator": "autoscaler.actuators",
    "engine kind": "agent.launchers",
}


def registered_names(kind: str) -> list[str]:
    """Sorted names registered for plugin ``kind`` (a key of PLUGIN_MODULES)."""
    module = importlib.import_module(PLUGIN_MODULES[kind])
    registry: Mapping[str, object] = module.REGISTRY
    return sorted(registry)
