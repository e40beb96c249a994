"""Actuators: carry out scaling decisions, registered by name (``autoscaling.actuator`` in a stack).

An actuator is as small as a KEDA scaler:

    current(pool) -> FleetView     what the pool runs now (authoritative replica ids when it knows them)
    apply(decision) -> None        start replicas, or drain and stop victims
    close() -> None                release resources (the local actuator stops its agents)

Every actuator is built the same way, ``cls.from_spec(spec, env)``, so the loop never branches on its type.
Each names where the control plane keeps restart leases on its target (``lease_store``, a name in
`control_plane.leases.stores.STORES`): Lease objects on a cluster, a file under the state dir locally.
`DryRun` wraps any actuator: it answers ``current`` from the wrapped one and only logs ``apply``.

    class MyActuator(Actuator, name="mine"):
        @classmethod
        def from_spec(cls, spec, env): ...
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from control_plane.scaling.decisions import Decision
from fleet.protocol.pools_wire import MeasuredNodeStarts
from fleet.spec.plugins import ACTUATOR, Registry
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["REGISTRY", "Actuator", "ActuatorEnv", "DryRun", "FleetView", "build_actuator"]

log = logging.getLogger("llmfleet.autoscaler.actuators")

REGISTRY: Registry[Actuator] = Registry(ACTUATOR)


@dataclass(frozen=True)
class FleetView:
    """What a pool runs according to the actuator. ``replicas`` is None when the actuator cannot name them
    (e.g. a Deployment's count); then the registry's reports name them."""

    target: int
    replicas: tuple[str, ...] | None = None
    agent_urls: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ActuatorEnv:
    """The I/O edges an actuator may need, filled once by the control plane's CLI (tests inject fakes).

    Names of cloud objects are not configuration here: they come from `fleet.protocol.contract`, the names the Pulumi
    program gives them.
    """

    stack: str  # the stack name or file agents are started with
    control_plane_url: str
    log_dir: Path | None = None
    state_dir: Path | None = None  # what outlives the control plane locally (leases, launched agents); None: nothing
    auth: str | None = None  # the control plane's --auth mode, which the agents it starts locally run too
    kubernetes_client: httpx.AsyncClient | None = None  # base_url = the API server; None: in-cluster account
    eks_client: Any = None  # a boto3 EKS client; None: boto3.client("eks") in the stack's region
    autoscaling_client: Any = None  # a boto3 Auto Scaling client; None: boto3.client("autoscaling")
    nodegroups: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (GPU group, zone) -> EKS node group
    pods: Actuator | None = None  # aws: the actuator for pods; None: kubernetes
    scale_pods: bool = True  # aws: False scales nodes only (node-group tests)


class Actuator(abc.ABC):
    name: ClassVar[str]
    lease_store: ClassVar[str] = "memory"

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            REGISTRY.register(name, cls)

    @classmethod
    @abc.abstractmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator: ...

    @abc.abstractmethod
    async def current(self, pool: PoolSpec) -> FleetView: ...

    @abc.abstractmethod
    async def apply(self, decision: Decision) -> None: ...

    async def reconcile(  # noqa: B027 - optional hook
        self, pool: PoolSpec, target: int, nodes_for: int | None = None
    ) -> None:
        """Called every tick with the replicas the pool holds GPUs for (`Decision.holding`: its target and its
        sleeping replicas) and those its nodes should have room for (`Decision.nodes_for`), whatever the decision:
        converge slow resources (the aws actuator grows node groups ahead and reclaims GPU nodes a drain emptied).
        Default: nothing."""

    def measured_node_starts(self, pool: PoolSpec) -> MeasuredNodeStarts | None:
        """The starts this actuator measured of the nodes it ordered for ``pool``'s GPU group
        (`control_plane.actuators.node_starts`); None: it orders no node, or none has started yet."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; default: nothing."""


class DryRun(Actuator):
    """Logs every decision and acts on none; ``current`` comes from the wrapped actuator."""

    def __init__(self, inner: Actuator) -> None:
        self.inner = inner
        self.applied: list[Decision] = []

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        raise TypeError("DryRun wraps an actuator; use build_actuator(..., dry_run=True)")

    async def current(self, pool: PoolSpec) -> FleetView:
        return await self.inner.current(pool)

    async def apply(self, decision: Decision) -> None:
        self.applied.append(decision)
        log.info(
            "dry-run %s %s: %d -> %d (%s)",
            decision.kind,
            decision.pool,
            decision.current,
            decision.target,
            decision.reason,
        )

    def measured_node_starts(self, pool: PoolSpec) -> MeasuredNodeStarts | None:
        return self.inner.measured_node_starts(pool)

    async def close(self) -> None:
        await self.inner.close()


def build_actuator(spec: FleetSpec, env: ActuatorEnv, name: str | None = None, dry_run: bool | None = None) -> Actuator:
    """The actuator named ``name`` (default: the stack's), wrapped in DryRun when asked or when the stack says so."""
    actuator = REGISTRY.get(name or spec.autoscaling.actuator).from_spec(spec, env)
    wanted = spec.autoscaling.dry_run if dry_run is None else dry_run
    return DryRun(actuator) if wanted else actuator


from control_plane.actuators import aws, kubernetes, local  # noqa: E402  (registration side effects)

del aws, kubernetes, local
