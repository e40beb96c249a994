"""Plugins of the control plane: the scaling-policy and actuator registries, for the stack loader."""

from __future__ import annotations

from control_plane.actuators import REGISTRY as ACTUATORS
from control_plane.scaling.policies import REGISTRY as POLICIES

__all__ = ["ACTUATORS", "POLICIES", "REGISTRIES"]

REGISTRIES = (POLICIES, ACTUATORS)
