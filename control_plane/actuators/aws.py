"""AwsActuator (``aws``): GPU nodes follow the replica count; pods scale through Kubernetes.

A pool on GPU group G spread over zones Z1..Zk runs on one EKS managed node group per zone. The Pulumi program
passes their names (``--nodegroup G:Z=NAME``, `ActuatorEnv.nodegroups`), so the actuator needs no list call and
no naming convention. Node counts:

    nodes_needed = ceil(target / replicas_per_node)       replicas_per_node = GPUs per instance // TP
    per zone     = nodes_needed spread evenly, clamped to the node group's own [minSize, maxSize]

* **Scale-up** raises each zone's ``desiredSize`` (``eks:UpdateNodegroupConfig``) before the pods, so engines
  find nodes instead of sitting Pending; a group at 0 nodes (staging) starts from zero this way. It never lowers
  ``desiredSize``: lowering it lets the Auto Scaling group terminate *any* instance, including one whose engine
  is serving.
* **Scale-down** drains and removes the victim pods first (the Kubernetes actuator), and nothing else.
* **Ahead** (`reconcile`, every tick): when the decision's ``nodes_for`` (replicas the demand trend needs a node
  start plus a cold start from now) exceeds its target, the zones grow for ``nodes_for`` already, so a replica
  that needs a new node finds it instead of waiting out the node's start after its own launch.
* **Measured node starts** (`reconcile`, every tick): each node a raise ordered is timed from the raise to its
  Ready condition and its first engine container's start (`control_plane.actuators.node_starts`), so
  ``GET /v1/pools`` and ``llmfleet status`` set what nodes take beside ``nodeColdStartSeconds``.
* **Reclaim** (`reconcile`, every tick): a GPU node of the group that runs no engine pod, beyond what the target
  and the group's ``minSize`` need in its zone, is cordoned and then terminated with
  ``autoscaling:TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=True)``: exactly the node a
  drain emptied goes, and the group's desired size follows. A node younger than ``reclaim_after_s`` is left
  alone (its engine may not be scheduled yet).

boto3 is synchronous, so AWS calls run in a worker thread. The EKS and Auto Scaling clients and the Kubernetes
client are injected (`ActuatorEnv`); pod scaling is delegated to an inner actuator (``kubernetes`` by default).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.actuators.kubernetes import MERGE_PATCH as _MERGE, KubernetesActuator
from control_plane.actuators.node_starts import NodeSeen, NodeStartLedger
from control_plane.scaling.decisions import Decision, ScaleUp
from fleet.capacity.catalog import INSTANCES
from fleet.protocol import contract
from fleet.protocol.clock import Clock, SystemClock
from fleet.protocol.pools_wire import MeasuredNodeStarts
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["AwsActuator", "spread"]

log = logging.getLogger("llmfleet.autoscaler.aws")


def spread(total: int, zones: int) -> list[int]:
    """``total`` split over ``zones`` as evenly as possible, earlier zones first: spread(5, 3) == [2, 2, 1]."""
    base, extra = divmod(total, zones)
    return [base + (1 if i < extra else 0) for i in range(zones)]


class AwsActuator(Actuator, name="aws"):
    lease_store = "kubernetes"  # restart leases as Lease objects in the fleet's namespace

    def __init__(
        self,
        spec: FleetSpec,
        eks: Any,
        pods: Actuator | None,
        nodegroups: Mapping[tuple[str, str], str],
        autoscaling: Any = None,
        kube: httpx.AsyncClient | None = None,
        clock: Clock | None = None,
        reclaim_after_s: float = 300.0,
    ) -> None:
        self.spec = spec
        self.eks = eks
        self.pods = pods
        self.nodegroups = dict(nodegroups)
        self.autoscaling = autoscaling
        self.kube = kube
        self.clock = clock or SystemClock()
        self.reclaim_after_s = reclaim_after_s
        self.cluster = contract.cluster_name(spec.environment)
        self.updates: list[dict[str, Any]] = []
        self.terminated: list[str] = []
        self.node_starts = NodeStartLedger()

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        import boto3

        eks = env.eks_client or boto3.client("eks", region_name=spec.region)
        autoscaling = env.autoscaling_client or boto3.client("autoscaling", region_name=spec.region)
        pods = env.pods
        if pods is None and env.scale_pods:
            pods = KubernetesActuator.from_spec(spec, env)
        kube = env.kubernetes_client or (pods.client if isinstance(pods, KubernetesActuator) else None)
        missing = [
            f"{group.name}:{zone}"
            for group in spec.gpu_node_groups
            for zone in spec.zones_of(group)
            if (group.name, zone) not in env.nodegroups
        ]
        if missing:
            raise ValueError(f"the aws actuator needs the node group of {', '.join(missing)} (--nodegroup G:Z=NAME)")
        return cls(spec, eks, pods, env.nodegroups, autoscaling, kube)

    def replicas_per_node(self, pool: PoolSpec) -> int:
        group = self.spec.node_group(self._group(pool))
        return max(1, INSTANCES[group.instance_type].gpu_count // pool.engine.tensor_parallel_size)

    @staticmethod
    def _group(pool: PoolSpec) -> str:
        if pool.node_group is None:
            raise ValueError(f"pool {pool.name!r} has no nodeGroup; the aws actuator needs one")
        return pool.node_group

    def zones(self, pool: PoolSpec) -> list[tuple[str, str]]:
        """(zone, node group name) of the pool's GPU group, in zone order."""
        group = self.spec.node_group(self._group(pool))
        return [(zone, self.nodegroups[(group.name, zone)]) for zone in self.spec.zones_of(group)]

    def wanted(self, pool: PoolSpec, replicas: int) -> dict[str, int]:
        """Nodes each zone needs for ``replicas`` of ``pool`` (before the groups' own bounds)."""
        zones = [zone for zone, _ in self.zones(pool)]
        return dict(zip(zones, spread(math.ceil(replicas / self.replicas_per_node(pool)), len(zones)), strict=True))

    async def _scaling(self, name: str) -> dict[str, int]:
        described = await asyncio.to_thread(self.eks.describe_nodegroup, clusterName=self.cluster, nodegroupName=name)
        scaling = described["nodegroup"]["scalingConfig"]
        return {key: int(scaling[key]) for key in ("minSize", "maxSize", "desiredSize")}

    async def grow_nodes(self, pool: PoolSpec, replicas: int) -> list[int]:
        """Raise each zone's desired size to what ``replicas`` need (never lower it); returns the sizes."""
        wanted = self.wanted(pool, replicas)
        sizes = []
        group = self._group(pool)
        for zone, name in self.zones(pool):
            scaling = await self._scaling(name)
            size = min(max(wanted[zone], scaling["desiredSize"], scaling["minSize"]), scaling["maxSize"])
            if size != scaling["desiredSize"]:
                config = {"minSize": scaling["minSize"], "maxSize": scaling["maxSize"], "desiredSize": size}
                await asyncio.to_thread(
                    self.eks.update_nodegroup_config, clusterName=self.cluster, nodegroupName=name, scalingConfig=config
                )
                self.updates.append({"nodegroup": name, **config})
                self.node_starts.ordered(group, zone, size - scaling["desiredSize"], self.clock.time())
            sizes.append(size)
        return sizes

    async def current(self, pool: PoolSpec) -> FleetView:
        if self.pods is not None:
            return await self.pods.current(pool)
        return FleetView(0)

    async def apply(self, decision: Decision) -> None:
        pool = self.spec.pool(decision.pool)
        if isinstance(decision, ScaleUp):
            await self.grow_nodes(pool, decision.holding)  # sleeping replicas keep their GPUs
        if self.pods is not None:
            await self.pods.apply(decision)

    async def reconcile(self, pool: PoolSpec, target: int, nodes_for: int | None = None) -> None:
        """Grow the group ahead of the replicas, then cordon and terminate its empty nodes beyond what each zone
        still needs.

        ``nodes_for`` (`Decision.nodes_for`: what the demand trend needs a node start plus a cold start ahead)
        above ``target`` raises the zones' desired sizes now, a node start before the replicas are launched.
        A zone needs max(the group's minSize, the nodes ``max(target, nodes_for)`` replicas of this pool want
        there + the nodes running engines of other pools on the same group). Only nodes no engine pod is bound
        to are taken, the newest first, and only once older than ``reclaim_after_s``.
        """
        keep = max(target, nodes_for or 0)
        if keep > target:
            await self.grow_nodes(pool, keep)
        if self.kube is None:
            return
        group = self._group(pool)
        nodes = await self._nodes(group)
        engines = await self._engine_pods()
        now = self.clock.time()
        seen = [_seen(n, engines.get(n.name, [])) for n in nodes]
        self.node_starts.observe(group, seen, now, self.spec.node_group(group).node_cold_start_seconds)
        if self.autoscaling is None:
            return
        pools_on = {node: {e.pool for e in on} for node, on in engines.items()}
        wanted = self.wanted(pool, keep)
        for zone, name in self.zones(pool):
            in_zone = [n for n in nodes if n.zone == zone]
            others = sum(1 for n in in_zone if pools_on.get(n.name, set()) - {pool.name})
            needed = max((await self._scaling(name))["minSize"], wanted[zone] + others)
            idle = sorted(
                (n for n in in_zone if not pools_on.get(n.name) and now - n.created >= self.reclaim_after_s),
                key=lambda n: n.created,
                reverse=True,  # the newest idle node first: the older ones hold the warmer model caches
            )
            for node in idle[: max(0, len(in_zone) - needed)]:
                await self._reclaim(node)

    async def _reclaim(self, node: _Node) -> None:
        assert self.kube is not None
        cordon = {"spec": {"unschedulable": True}}
        response = await self.kube.patch(f"/api/v1/nodes/{node.name}", json=cordon, headers=_MERGE)
        if response.status_code >= 400:
            log.warning("cordon %s: HTTP %d; not terminating it", node.name, response.status_code)
            return
        await asyncio.to_thread(
            self.autoscaling.terminate_instance_in_auto_scaling_group,
            InstanceId=node.instance_id,
            ShouldDecrementDesiredCapacity=True,
        )
        self.terminated.append(node.instance_id)
        log.info("reclaimed empty GPU node %s (%s in %s)", node.name, node.instance_id, node.zone)

    async def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        assert self.kube is not None
        response = await self.kube.get(path, params=params)
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json().get("items", [])
        return items

    async def _nodes(self, group: str) -> list[_Node]:
        items = await self._get("/api/v1/nodes", {"labelSelector": f"{contract.LABEL_GPU_GROUP}={group}"})
        out = []
        for item in items:
            meta, spec = item.get("metadata", {}), item.get("spec", {})
            provider = str(spec.get("providerID", ""))  # aws:///us-east-1a/i-0123456789abcdef0
            if spec.get("unschedulable") or not provider.startswith("aws://"):
                continue  # cordoned by someone (maybe us, last tick): not ours to count or take
            created = _time(meta.get("creationTimestamp")) or 0.0
            zone = meta.get("labels", {}).get(contract.ZONE_TOPOLOGY_KEY, "")
            ready = _condition(item.get("status", {}), "Ready")
            out.append(_Node(meta.get("name", ""), zone, provider.rsplit("/", 1)[-1], created, ready))
        return out

    async def _engine_pods(self) -> dict[str, list[_Engine]]:
        """Node name -> the engine pods bound to it (any phase but finished)."""
        selector = f"{contract.LABEL_COMPONENT}={contract.COMPONENT_ENGINE}"
        items = await self._get(f"/api/v1/namespaces/{self.spec.cluster.namespace}/pods", {"labelSelector": selector})
        out: dict[str, list[_Engine]] = {}
        for pod in items:
            node, status = pod.get("spec", {}).get("nodeName"), pod.get("status", {})
            if node and status.get("phase") not in ("Succeeded", "Failed"):
                pool = str(pod.get("metadata", {}).get("labels", {}).get(contract.LABEL_POOL, ""))
                running = [_time((c.get("state") or {}).get("running", {}).get("startedAt")) for c in
                           status.get("containerStatuses") or []]  # fmt: skip
                started = min((t for t in running if t is not None), default=None)
                out.setdefault(str(node), []).append(_Engine(pool, _condition(status, "PodScheduled"), started))
        return out

    def measured_node_starts(self, pool: PoolSpec) -> MeasuredNodeStarts | None:
        if pool.node_group is None:
            return None
        group = self.spec.node_group(pool.node_group)
        return self.node_starts.summary(group.name, group.node_cold_start_seconds)

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()


@dataclass(frozen=True)
class _Node:
    name: str
    zone: str
    instance_id: str
    created: float
    ready_at: float | None = None  # its Ready condition's last transition to True


@dataclass(frozen=True)
class _Engine:
    pool: str
    scheduled_at: float | None  # its PodScheduled condition's transition to True
    running_at: float | None  # its first container's state.running.startedAt


def _time(stamp: object) -> float | None:
    """An API server timestamp (RFC 3339, ``Z``) as Unix time; None when absent or unreadable."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp() if stamp else None
    except ValueError:
        return None


def _condition(status: dict[str, Any], kind: str) -> float | None:
    """When ``status``'s condition ``kind`` last turned True; None while it is not True."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return _time(condition.get("lastTransitionTime"))
    return None


def _seen(node: _Node, engines: list[_Engine]) -> NodeSeen:
    """What the node-start ledger reads of ``node``: its first scheduled engine pod's times."""
    scheduled = [e for e in engines if e.scheduled_at is not None]
    first = min(scheduled, key=lambda e: e.scheduled_at or 0.0, default=None)
    return NodeSeen(
        node.name,
        node.zone,
        node.created,
        node.ready_at,
        None if first is None else first.scheduled_at,
        None if first is None else first.running_at,
    )
