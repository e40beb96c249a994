"""What ``GET /v1/pools`` answers: each pool's bounds, counts and last decision, with the starts the control plane
measured (`control_plane.starts`: its replicas'; `control_plane.actuators.node_starts`: its GPU group's nodes')."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fleet.protocol.wire import Name, Seconds, StartPhases, Text, Wire

__all__ = ["MeasuredNodeStarts", "MeasuredStarts", "NodeStart", "PoolSummary", "PoolsResponse"]


class MeasuredStarts(Wire):
    """A pool's last measured starts (`control_plane.starts`): fetch plus launch to ready, each start once."""

    count: int
    p50_s: float
    max_s: float
    cold_start_s: float = Field(description="the pool's coldStartSeconds, what the scaler leads by")
    last: StartPhases


class NodeStart(Wire):
    """One GPU node's start, as the aws actuator measured it (`control_plane.actuators.node_starts`): seconds from
    the desired-size raise that ordered it to its Node object (``registered_s``: EC2 boot, nodeadm join), to its
    Ready condition, and ``start_s``, to a node that can start an engine: ready plus ``pull_s``, its first engine
    pod's scheduling to its first running container (the image pull)."""

    node: Name
    zone: Text
    registered_s: Seconds
    ready_s: Seconds
    pull_s: Seconds
    start_s: Seconds


class MeasuredNodeStarts(Wire):
    """A GPU group's last measured node starts beside its ``nodeColdStartSeconds``, each node once."""

    group: Name
    count: int
    p50_s: float
    max_s: float
    node_cold_start_s: float
    last: NodeStart


class PoolSummary(Wire):
    """One pool as ``GET /v1/pools`` shows it: bounds, replica counts and the last decision."""

    pool: str
    model: str
    min: int
    max: int
    replicas: int = Field(description="replicas reported and not stopped (stale ones included)")
    ready: int = Field(description="ready replicas whose reports are fresh")
    stale: int
    last_decision: dict[str, Any] | None = Field(description="as in GET /v1/decisions; None before the first tick")
    starts: MeasuredStarts | None = Field(default=None, description="measured starts; None before the first")
    node_starts: MeasuredNodeStarts | None = Field(default=None, description="its GPU group's (aws); None before")


class PoolsResponse(Wire):
    pools: list[PoolSummary]
    generated_at: float
