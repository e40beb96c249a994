"""Measured node starts: how long a GPU node the aws actuator orders really takes to run an engine.

The control plane orders nodes a node start ahead of the replicas that need them (`Decision.nodes_for`, the GPU
group's ``nodeColdStartSeconds``). That figure is the operator's until the cluster measures it, so the aws actuator
measures every node it orders, from what the cluster itself records:

    order   the actuator raises a zone's desiredSize by k at t0: k orders queue in that (group, zone), oldest first
    match   a GPU node of the group that appears in the zone, created after the oldest open order, takes it
    steps   registered  its Node's creationTimestamp - t0          (EC2 boot, nodeadm join)
            ready       its Ready condition's lastTransitionTime - t0
            pull        its first engine pod: PodScheduled to its first running container (the image pull)
            start       ready + pull: what ``nodeColdStartSeconds`` stands for

The fields are the core API's: a condition's ``type``, ``status`` ("True") and ``lastTransitionTime`` (the Node's
``Ready``, the Pod's ``PodScheduled``, kubernetes.io "Pod Conditions"), a container status's
``state.running.startedAt``, an object's ``metadata.creationTimestamp``.

A node counts once, when its first engine container runs; the last `KEPT` starts of each group are kept, and a
median longer than ``nodeColdStartSeconds`` by `SLOWER_THAN_CONFIGURED` is logged (replicas that need a new node
are then ordered too late). The pull is measured from the pod's scheduling, not from the node's readiness, so a
node that waited idle for an engine does not read as slow. An order no node answers within `ORDER_EXPIRES_S` (the
group was at its maxSize, or the instance never joined) is dropped. A node created after an order by something else
(the Auto Scaling group replacing an unhealthy instance) takes the order all the same: a start of a node is
measured either way.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.protocol.pools_wire import MeasuredNodeStarts, NodeStart

__all__ = ["KEPT", "ORDER_EXPIRES_S", "SLOWER_THAN_CONFIGURED", "NodeSeen", "NodeStartLedger"]

log = logging.getLogger("llmfleet.control_plane.node_starts")

KEPT = 20  # node starts kept per group
SLOWER_THAN_CONFIGURED = 1.2  # a median this much longer than nodeColdStartSeconds is logged
ORDER_EXPIRES_S = 3600.0  # an order no node has answered in an hour is dropped


@dataclass(frozen=True)
class NodeSeen:
    """A GPU node of the group as the API server shows it (Unix times; None: not yet)."""

    name: str
    zone: str
    created: float
    ready_at: float | None
    engine_scheduled_at: float | None  # its first engine pod's PodScheduled condition
    engine_running_at: float | None  # that pod's first container's state.running.startedAt


@dataclass
class NodeStartLedger:
    """Orders per (group, zone), the node each was matched to, and the last `KEPT` measured starts per group."""

    orders: dict[tuple[str, str], deque[float]] = field(default_factory=dict)
    matched: dict[str, float] = field(default_factory=dict)  # node -> the time of the order it answers
    done: set[str] = field(default_factory=set)  # nodes counted, or seen before any order (not ours to time)
    kept: dict[str, deque[NodeStart]] = field(default_factory=dict)
    warned: dict[str, float] = field(default_factory=dict)

    def ordered(self, group: str, zone: str, count: int, at: float) -> None:
        """The actuator raised ``zone``'s desired size of ``group`` by ``count`` at ``at``."""
        queue = self.orders.setdefault((group, zone), deque())
        queue.extend([at] * max(0, count))

    def observe(self, group: str, nodes: Sequence[NodeSeen], now: float, node_cold_start_s: float) -> list[NodeStart]:
        """Match the group's new nodes to its open orders and count those whose engine runs; the starts counted."""
        for (g, zone), queue in self.orders.items():
            while g == group and queue and now - queue[0] > ORDER_EXPIRES_S:
                log.info("node group %s, zone %s: an order of %.0f s ago got no node; dropped", g, zone, now - queue[0])
                queue.popleft()
        counted = []
        for node in sorted(nodes, key=lambda n: n.created):
            if node.name in self.done:
                continue
            if node.name not in self.matched:
                open_orders = self.orders.get((group, node.zone))
                if not open_orders or node.created < open_orders[0]:
                    self.done.add(node.name)  # there before the oldest open order: not one we ordered
                    continue
                self.matched[node.name] = open_orders.popleft()
            start = _measured(node, self.matched[node.name])
            if start is not None:
                self.done.add(node.name)
                del self.matched[node.name]
                self.kept.setdefault(group, deque(maxlen=KEPT)).append(start)
                counted.append(start)
        if counted:
            self._check(group, node_cold_start_s)
        return counted

    def summary(self, group: str, node_cold_start_s: float) -> MeasuredNodeStarts | None:
        """The group's measured node starts beside its ``nodeColdStartSeconds``; None before the first."""
        starts = self.kept.get(group)
        if not starts:
            return None
        ordered = sorted(s.start_s for s in starts)
        return MeasuredNodeStarts(
            group=group,
            count=len(ordered),
            p50_s=round(ordered[(len(ordered) - 1) // 2], 3),
            max_s=round(ordered[-1], 3),
            node_cold_start_s=node_cold_start_s,
            last=starts[-1],
        )

    def _check(self, group: str, node_cold_start_s: float) -> None:
        summary = self.summary(group, node_cold_start_s)
        assert summary is not None
        if summary.p50_s > node_cold_start_s * SLOWER_THAN_CONFIGURED and self.warned.get(group) != summary.p50_s:
            self.warned[group] = summary.p50_s
            log.warning(
                "GPU group %s: its nodes' median start is %.0f s over %d nodes, nodeColdStartSeconds says %.0f s: "
                "replicas that need a new node are ordered too late; set nodeColdStartSeconds to what they measure",
                group,
                summary.p50_s,
                summary.count,
                node_cold_start_s,
            )


def _measured(node: NodeSeen, ordered_at: float) -> NodeStart | None:
    """The node's start since ``ordered_at``; None until its first engine container runs."""
    if node.ready_at is None or node.engine_scheduled_at is None or node.engine_running_at is None:
        return None
    ready = max(0.0, node.ready_at - ordered_at)
    pull = max(0.0, node.engine_running_at - max(node.engine_scheduled_at, node.ready_at))
    return NodeStart(
        node=node.name,
        zone=node.zone,
        registered_s=round(max(0.0, node.created - ordered_at), 3),
        ready_s=round(ready, 3),
        pull_s=round(pull, 3),
        start_s=round(ready + pull, 3),
    )
