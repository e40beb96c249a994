"""Registries: every component's plugin registries, for commands that check a whole stack.

The core (`fleet.spec.loader`, `fleet.spec.validate`) imports no component; commands that load a stack for the whole
fleet (``validate``, ``plan``, ``up``, ``policy check``) gather the registries here, at the edge.
"""

from __future__ import annotations

from typing import Any

from fleet.spec.plugins import Registry

__all__ = ["all_registries"]


def all_registries() -> tuple[Registry[Any], ...]:
    """The registries of the gateway, the control plane and the agent, every shipped plugin registered."""
    from agent.launchers import REGISTRY as LAUNCHERS
    from control_plane.plugins import REGISTRIES as CONTROL_PLANE
    from gateway.routing import REGISTRIES as ROUTING

    return (*ROUTING, *CONTROL_PLANE, LAUNCHERS)
