"""Paid capacity: the whole GPU nodes a fleet pays for, with every pool's replicas packed onto them.

A node group is paid by the node: ``nodes x GPUs per node``, whether replicas use those GPUs or not. Per zone,
the nodes paid are the larger of ``minNodesPerAz`` and the nodes the zone's replicas pack onto: each replica
needs ``tensorParallelSize`` GPUs on one node, and every pool naming the group packs onto the same nodes
(first-fit decreasing, which is optimal when replica sizes divide the node, as tensor parallel sizes 1, 2, 4
and 8 do). A pool's replicas spread over its zones as evenly as a zone topology spread allows, the remainder
in the first zones. Pools without a node group run on GPUs of an existing cluster and are paid by the GPU.

Paid-GPU utilisation is used GPUs / paid GPUs; the seed's target is 70% (under it the fleet pays for idle
GPUs). `paid_options` names what would raise it, with the figure each would give where the catalogue allows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.capacity.catalog import GPUS, INSTANCES, SPOT_PRICES, instance_hour_usd
from fleet.capacity.plan import HOURS_PER_MONTH, PoolPlan, kv_budget_bytes, model_facts, plan_pool
from fleet.spec.stack import FleetSpec, GpuNodeGroupSpec

__all__ = [
    "PAID_GPU_UTILISATION_TARGET",
    "GroupPlan",
    "PaidOption",
    "PaidPoint",
    "instance_gpu_hour",
    "nodes_per_zone",
    "pack_zone",
    "paid_options",
    "plan_groups",
    "zone_shares",
]

# The seed's utilisation band is 70-85%: under 70% the fleet pays for too many GPUs.
PAID_GPU_UTILISATION_TARGET = 0.70
EXISTING_CLUSTER = ""  # GroupPlan.group of pools on an existing cluster's GPUs (no node group)


def zone_shares(replicas: int, zones: int) -> list[int]:
    """Replicas per zone under a zone topology spread: even, the remainder in the first zones (7, 3 -> 3, 2, 2)."""
    base, extra = divmod(replicas, zones)
    return [base + (1 if i < extra else 0) for i in range(zones)]


def pack_zone(replica_gpus: Sequence[int], gpus_per_node: int) -> int:
    """Nodes of ``gpus_per_node`` GPUs that hold replicas needing ``replica_gpus`` GPUs each (first-fit decreasing)."""
    free: list[int] = []
    for size in sorted(replica_gpus, reverse=True):
        for i, left in enumerate(free):
            if left >= size:
                free[i] -= size
                break
        else:
            free.append(gpus_per_node - size)
    return len(free)


def nodes_per_zone(
    replicas: Sequence[int], replica_gpus: Sequence[int], zones: int, gpus_per_node: int, min_per_zone: int
) -> list[int]:
    """Nodes paid in each of ``zones`` while pool ``i`` runs ``replicas[i]`` replicas of ``replica_gpus[i]`` GPUs
    each: every pool spread by `zone_shares`, the zone's replicas packed together (`pack_zone`), at least
    ``min_per_zone`` (the group's ``minNodesPerAz``)."""
    shares = [zone_shares(n, zones) for n in replicas]
    return [
        max(
            min_per_zone,
            pack_zone([g for g, s in zip(replica_gpus, shares, strict=True) for _ in range(s[z])], gpus_per_node),
        )
        for z in range(zones)
    ]


@dataclass(frozen=True)
class PaidPoint:
    """A node group's paid capacity with a given number of replicas per pool (its min or its peak)."""

    replicas: int
    nodes_per_zone: list[int]
    gpus_per_node: int
    used_gpus: int
    gpu_hour_usd: float

    @property
    def nodes(self) -> int:
        return sum(self.nodes_per_zone)

    @property
    def paid_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def idle_gpus(self) -> int:
        return self.paid_gpus - self.used_gpus

    @property
    def paid_utilisation(self) -> float:
        """Used GPUs / paid GPUs (1.0 when nothing is paid: no GPU idles)."""
        return self.used_gpus / self.paid_gpus if self.paid_gpus else 1.0

    @property
    def node_hours_month(self) -> float:
        return self.nodes * HOURS_PER_MONTH

    @property
    def monthly_cost_usd(self) -> float:
        return self.paid_gpus * self.gpu_hour_usd * HOURS_PER_MONTH


@dataclass(frozen=True)
class GroupPlan:
    """One node group (or the existing cluster's GPUs) with the pools it carries, at their min and at peak."""

    group: str  # EXISTING_CLUSTER for pools without a node group
    instance_type: str | None
    gpu: str
    capacity_type: str  # on-demand, spot, capacity-block, or "existing cluster"
    zones: list[str]
    min_nodes_per_az: int
    max_nodes_per_az: int | None
    pools: list[str]
    at_min: PaidPoint
    at_peak: PaidPoint
    notes: list[str] = field(default_factory=list)

    @property
    def gpus_per_node(self) -> int:
        return self.at_peak.gpus_per_node


def _gpu_hour(spec: FleetSpec, gpu: str) -> float:
    """Per GPU-hour of a GPU no instance type names (an existing cluster's): the stack's price, else the GPU's."""
    return spec.cost.gpu_hour_usd if spec.cost.gpu_hour_usd is not None else GPUS[gpu].hour_usd


def instance_gpu_hour(
    spec: FleetSpec, instance_type: str, capacity_type: str, stack_price: bool = True
) -> tuple[float, str | None]:
    """Per GPU-hour of a node group of ``instance_type``, and a note when that price is a stand-in.

    The stack's ``cost.gpuHourUsd`` wins (unless ``stack_price`` is false: it prices the stack's own GPU, not
    another); else the catalogue's price of the instance in the stack's region
    (`fleet.capacity.catalog.instance_hour_usd`)
    divided by its GPUs; else the GPU's price.
    """
    instance = INSTANCES[instance_type]
    if stack_price and spec.cost.gpu_hour_usd is not None:
        return spec.cost.gpu_hour_usd, None
    price = instance_hour_usd(instance_type, spec.region, capacity_type)
    if price is None:
        hour = GPUS[instance.gpu].hour_usd
        return hour, (
            f"the catalogue has no on-demand price of {instance_type} in {spec.region}: priced at the "
            f"{instance.gpu} rate, ${hour:.2f} per GPU-hour (set cost.gpuHourUsd)"
        )
    hour = price.usd / instance.gpu_count
    basis = f"${price.usd:,.3f} an hour / {instance.gpu_count} GPUs ({price.source}, {price.as_of})"
    if capacity_type == "spot" and SPOT_PRICES.get(instance_type, {}).get(spec.region) is None:
        return hour, f"spot nodes priced at on demand, {basis}: the most a spot request pays by default"
    if capacity_type == "capacity-block":
        return hour, f"capacity-block nodes priced at on demand, {basis}: a block's price is set when it is bought"
    return hour, None


def _group_plan(
    spec: FleetSpec, group: GpuNodeGroupSpec, plans: Sequence[PoolPlan], hour: float, note: str | None = None
) -> GroupPlan:
    instance = INSTANCES[group.instance_type]
    zones = spec.zones_of(group)
    pools = [spec.pool(p.pool) for p in plans]

    def point(replicas: Sequence[int]) -> PaidPoint:
        gpus = [pool.engine.tensor_parallel_size for pool in pools]
        nodes = nodes_per_zone(replicas, gpus, len(zones), instance.gpu_count, group.min_nodes_per_az)
        used = sum(n * pool.engine.tensor_parallel_size for n, pool in zip(replicas, pools, strict=True))
        return PaidPoint(sum(replicas), nodes, instance.gpu_count, used, hour)

    at_min = point([p.replicas_min for p in plans])
    at_peak = point([p.replicas_peak for p in plans])
    notes: list[str] = [] if note is None else [note]
    crowded = max(at_peak.nodes_per_zone, default=0)
    if crowded > group.max_nodes_per_az:
        notes.append(
            f"the busiest zone needs {crowded} nodes at peak but maxNodesPerAz is {group.max_nodes_per_az}: "
            "replicas beyond it stay pending"
        )
    return GroupPlan(
        group=group.name,
        instance_type=group.instance_type,
        gpu=instance.gpu,
        capacity_type=group.capacity_type,
        zones=zones,
        min_nodes_per_az=group.min_nodes_per_az,
        max_nodes_per_az=group.max_nodes_per_az,
        pools=[p.pool for p in plans],
        at_min=at_min,
        at_peak=at_peak,
        notes=notes,
    )


def _cluster_plan(spec: FleetSpec, plans: Sequence[PoolPlan]) -> GroupPlan:
    """Pools on an existing cluster's GPUs: paid by the GPU, so every paid GPU is used."""

    def point(replicas: Sequence[int]) -> PaidPoint:
        used = sum(n * p.gpus_per_replica for n, p in zip(replicas, plans, strict=True))
        return PaidPoint(sum(replicas), [used], 1, used, _gpu_hour(spec, plans[0].gpu))

    return GroupPlan(
        group=EXISTING_CLUSTER,
        instance_type=None,
        gpu=plans[0].gpu,
        capacity_type="existing cluster",
        zones=list(spec.availability_zones),
        min_nodes_per_az=0,
        max_nodes_per_az=None,
        pools=[p.pool for p in plans],
        at_min=point([p.replicas_min for p in plans]),
        at_peak=point([p.replicas_peak for p in plans]),
    )


def plan_groups(spec: FleetSpec, plans: Sequence[PoolPlan] | None = None) -> list[GroupPlan]:
    """Paid capacity of every GPU node group that carries pools, then of pools on an existing cluster."""
    plans = list(plans) if plans is not None else [plan_pool(spec, pool) for pool in spec.pools]
    by_pool = {p.pool: p for p in plans}
    groups: list[GroupPlan] = []
    for group in spec.gpu_node_groups:
        carried = [by_pool[p.name] for p in spec.pools if p.node_group == group.name and p.name in by_pool]
        if carried or group.min_nodes_per_az:  # A group no pool names still pays for its minimum.
            hour, note = instance_gpu_hour(spec, group.instance_type, group.capacity_type)
            groups.append(_group_plan(spec, group, carried, hour, note))
    loose = [by_pool[p.name] for p in spec.pools if p.node_group is None and p.name in by_pool]
    if loose:
        groups.append(_cluster_plan(spec, loose))
    return groups


@dataclass(frozen=True)
class PaidOption:
    """One way to raise a group's paid-GPU utilisation; figures are at peak, None where not computable."""

    kind: str  # instance-type, zones, sharing, reservation
    text: str
    paid_utilisation: float | None = None
    monthly_cost_usd: float | None = None


def _with_group(spec: FleetSpec, name: str, **update: object) -> FleetSpec:
    groups = [g.model_copy(update=update) if g.name == name else g for g in spec.gpu_node_groups]
    return spec.model_copy(update={"gpu_node_groups": groups})


def _derived_qps(spec: FleetSpec, pools: Sequence[str]) -> FleetSpec:
    """``spec`` with ``pools``' measured per-replica QPS dropped: it was measured on another GPU."""
    changed = [
        p.model_copy(update={"workload": p.workload.model_copy(update={"per_replica_qps": None})})
        if p.name in pools
        else p
        for p in spec.pools
    ]
    return spec.model_copy(update={"pools": changed})


def _instance_options(spec: FleetSpec, plan: GroupPlan) -> list[PaidOption]:
    """Instance types with fewer GPUs per node that hold every pool of the group at its SLO."""
    pools = [spec.pool(p) for p in plan.pools]
    fits: list[tuple[float, PaidOption]] = []
    same_gpu = False
    for name, instance in INSTANCES.items():
        if instance.gpu_count >= plan.gpus_per_node or instance.gpu == "cpu-demo":
            continue
        if any(instance.gpu_count % p.engine.tensor_parallel_size for p in pools):
            continue
        gpu = GPUS[instance.gpu]
        if any(
            kv_budget_bytes(gpu, model_facts(p), p.engine.tensor_parallel_size, p.engine.gpu_memory_utilization) <= 0
            for p in pools
        ):
            continue
        trial = _with_group(spec, plan.group, instance_type=name)
        if gpu.name != plan.gpu:
            trial = _derived_qps(trial, plan.pools)
        trial_plans = [plan_pool(trial, trial.pool(p.name)) for p in pools]
        if any(
            t.per_replica_qps <= 0
            or t.concurrency_per_replica < 1
            or t.replicas_needed > t.replicas_max
            or t.idle_prefill_ms > p.slo.ttft_p99_ms
            for t, p in zip(trial_plans, pools, strict=True)
        ):
            continue
        trial_group = trial.node_group(plan.group)
        hour, _ = instance_gpu_hour(trial, name, trial_group.capacity_type, stack_price=gpu.name == plan.gpu)
        peak = _group_plan(trial, trial_group, trial_plans, hour).at_peak
        same_gpu = same_gpu or gpu.name == plan.gpu
        replicas = sum(t.replicas_peak for t in trial_plans)
        text = (
            f"{name} ({instance.gpu_count} x {gpu.name}): {replicas} replicas at peak on {peak.paid_gpus} paid GPUs "
            f"({peak.paid_utilisation:.0%}), ${peak.monthly_cost_usd:,.0f}/month at ${hour:.2f}/GPU-hour"
        )
        busiest = max(peak.nodes_per_zone, default=0)
        if busiest > trial_group.max_nodes_per_az:
            text += f" (needs maxNodesPerAz {busiest})"
        fits.append(
            (peak.monthly_cost_usd, PaidOption("instance-type", text, peak.paid_utilisation, peak.monthly_cost_usd))
        )
    options = [o for _, o in sorted(fits, key=lambda f: f[0])[:3]]
    if not same_gpu:
        options.insert(
            0,
            PaidOption(
                "instance-type",
                f"the catalogue has no {plan.gpu} instance type with fewer than {plan.gpus_per_node} GPUs a node"
                + ("" if options else ", nor another GPU's that holds the model at its SLO"),
            ),
        )
    return options


def _zone_options(spec: FleetSpec, plan: GroupPlan, production: bool) -> list[PaidOption]:
    if len(plan.zones) < 2:
        return []
    if production:
        return [
            PaidOption(
                "zones",
                f"fewer zones: not in a production stack ({len(plan.zones)} zones keep replicas through a zone outage)",
            )
        ]
    pools = [spec.pool(p) for p in plan.pools]
    options = []
    for count in range(len(plan.zones) - 1, 0, -1):
        trial = _with_group(spec, plan.group, zones=plan.zones[:count])
        trial_plans = [plan_pool(trial, p) for p in pools]
        peak = _group_plan(trial, trial.node_group(plan.group), trial_plans, plan.at_peak.gpu_hour_usd).at_peak
        options.append(
            PaidOption(
                "zones",
                f"{count} zone{'s' if count > 1 else ''} instead of {len(plan.zones)}: {peak.paid_gpus} paid GPUs "
                f"at peak ({peak.paid_utilisation:.0%}), ${peak.monthly_cost_usd:,.0f}/month",
                peak.paid_utilisation,
                peak.monthly_cost_usd,
            )
        )
    return options


def paid_options(
    spec: FleetSpec, plan: GroupPlan, production: bool | None = None, target: float = PAID_GPU_UTILISATION_TARGET
) -> list[PaidOption]:
    """What would raise ``plan``'s paid-GPU utilisation at peak; empty at or above ``target``.

    ``production`` (default: the environment is ``prod``) rules out fewer zones.
    """
    if plan.group == EXISTING_CLUSTER or plan.at_peak.paid_utilisation >= target:
        return []
    if not plan.pools:
        return [
            PaidOption(
                "sharing",
                f"no pool names node group {plan.group!r}: point a pool at it (nodeGroup: {plan.group}) or set its "
                "minNodesPerAz to 0",
                None,
                0.0,
            )
        ]
    production = spec.environment == "prod" if production is None else production
    options = _instance_options(spec, plan)
    options += _zone_options(spec, plan, production)
    per_zone = math.floor(plan.at_peak.idle_gpus / max(1, len(plan.zones)))
    options.append(
        PaidOption(
            "sharing",
            f"more pools or models on the {plan.group!r} nodes (nodeGroup: {plan.group}): {plan.at_peak.idle_gpus} "
            f"GPUs idle at peak (about {per_zone} per zone), {plan.at_min.idle_gpus} at min, at no extra cost",
            1.0 if plan.at_peak.idle_gpus else None,
            plan.at_peak.monthly_cost_usd,
        )
    )
    options.append(
        PaidOption(
            "reservation",
            "reservations or capacity blocks lower the price per GPU-hour, not the idle share "
            f"({plan.at_peak.paid_utilisation:.0%} stays); the catalogue has no reserved or capacity-block price",
            plan.at_peak.paid_utilisation,
        )
    )
    return options
