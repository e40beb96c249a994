"""Launchers: engine kinds by name (``REGISTRY``), each building its command line from a pool spec."""

from __future__ import annotations

from agent.launchers import sim, vllm
from agent.launchers.base import (
    REGISTRY,
    REMOVED_FLAGS,
    EngineHandle,
    EngineProcess,
    LaunchConfig,
    Launcher,
    make_launcher,
)

__all__ = [
    "REGISTRY",
    "REMOVED_FLAGS",
    "EngineHandle",
    "EngineProcess",
    "LaunchConfig",
    "Launcher",
    "make_launcher",
    "sim",
    "vllm",
]
