"""GPU rules: zonal spread of GPU capacity and engine pods, GPU requests, GPU memory headroom."""

from __future__ import annotations

from collections import defaultdict

from pulumi_policy import (
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.protocol import contract
from policies.common import (
    NODE_GROUP,
    PRODUCTION_SCHEMA,
    annotations_of,
    as_float,
    as_int,
    containers,
    environment,
    is_engine,
    is_gpu_node_group,
    is_production,
    mapping,
    pod_spec,
    sequence,
)

__all__ = [
    "gpu_capacity_spans_zones",
    "gpu_memory_headroom",
    "gpu_requests_match_tensor_parallel",
    "pools_spread_across_zones",
]


def gpu_capacity_spans_zones_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    config = args.get_config()
    minimum = int(config.get("minZones", 2))
    zones: dict[tuple[str, str], set[str]] = defaultdict(set)
    urns: dict[tuple[str, str], str] = {}
    for resource in args.resources:
        props = resource.props
        if resource.resource_type != NODE_GROUP or not is_gpu_node_group(props):
            continue
        if not is_production(props, config):
            continue
        tags = mapping(props.get("tags"))
        key = (environment(props), str(tags.get(contract.TAG_GPU_GROUP, resource.name)))
        zones[key].add(str(tags.get(contract.TAG_ZONE, "?")))
        urns.setdefault(key, resource.urn)
    for (env, group), found in sorted(zones.items()):
        if len(found) < minimum:
            report_violation(
                f"GPU node group {group!r} of production stack {env!r} runs in {len(found)} availability zone(s) "
                f"({', '.join(sorted(found))}); it needs at least {minimum}. Risk: one zone outage or a zonal "
                "GPU shortage takes down every replica of its pools.",
                urns[(env, group)],
            )


def pools_spread_across_zones_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    config = args.get_config()
    constraints = [mapping(c) for c in sequence(pod_spec(args.props).get("topologySpreadConstraints"))]
    zonal = [c for c in constraints if c.get("topologyKey") == contract.ZONE_TOPOLOGY_KEY]
    if not zonal:
        report_violation(
            "engine pods have no topologySpreadConstraint on topology.kubernetes.io/zone. Risk: the scheduler "
            "may pack every replica into one zone, and that zone's outage stops the pool.",
            None,
        )
        return
    hard = any(c.get("whenUnsatisfiable") == "DoNotSchedule" for c in zonal)
    if is_production(args.props, config) and not hard:
        report_violation(
            "a production engine pool spreads across zones only as a preference (ScheduleAnyway). Risk: under "
            "GPU pressure replicas pile into one zone and a zone outage drops below the minimum.",
            None,
        )


def gpu_requests_match_tensor_parallel_validator(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    ann = annotations_of(args.props)
    if ann.get(contract.ANN_ENGINE_KIND) == "sim":
        return  # simulated engines need no GPU
    tp = as_int(ann.get(contract.ANN_TENSOR_PARALLEL))
    if tp is None:
        report_violation(
            f"engine Deployment lacks the {contract.ANN_TENSOR_PARALLEL} annotation, so its GPU request cannot "
            "be checked. Risk: replicas start with the wrong number of GPUs and crash or waste GPUs.",
            None,
        )
        return
    for container in containers(args.props):
        resources = mapping(container.get("resources"))
        limit = as_int(mapping(resources.get("limits")).get(contract.GPU_RESOURCE), 0)
        request = as_int(mapping(resources.get("requests")).get(contract.GPU_RESOURCE), limit)
        if limit != tp or request != tp:
            report_violation(
                f"container {container.get('name')!r} asks for {limit} GPU(s) (request {request}) but the engine "
                f"runs tensor parallel size {tp}. Risk: vLLM fails to start with too few GPUs, or idle GPUs are "
                "paid for with too many.",
                None,
            )


def gpu_memory_headroom_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    ceiling = float(args.get_config().get("maxGpuMemoryUtilization", 0.95))
    value = as_float(annotations_of(args.props).get(contract.ANN_GPU_MEMORY_UTILIZATION))
    if value is not None and value > ceiling:
        report_violation(
            f"gpuMemoryUtilization {value:g} exceeds {ceiling:g}. Risk: CUDA graphs, NCCL buffers and the "
            "sampler run out of memory under load and the engine crashes (OOM) mid-request.",
            None,
        )


gpu_capacity_spans_zones = StackValidationPolicy(
    name="gpu-capacity-spans-zones",
    description="Production GPU node groups span at least two availability zones.",
    validate=gpu_capacity_spans_zones_validator,
    config_schema=PolicyConfigSchema(properties={**PRODUCTION_SCHEMA, "minZones": {"type": "integer", "default": 2}}),
)

pools_spread_across_zones = ResourceValidationPolicy(
    name="pools-spread-across-zones",
    description="Engine pods spread over zones (hard constraint in production).",
    validate=pools_spread_across_zones_validator,
    config_schema=PolicyConfigSchema(properties=dict(PRODUCTION_SCHEMA)),
)

gpu_requests_match_tensor_parallel = ResourceValidationPolicy(
    name="gpu-requests-match-tensor-parallel",
    description="Each engine container requests exactly tensor-parallel-size GPUs.",
    validate=gpu_requests_match_tensor_parallel_validator,
)

gpu_memory_headroom = ResourceValidationPolicy(
    name="gpu-memory-headroom",
    description="vLLM gpuMemoryUtilization stays at or below 0.95.",
    validate=gpu_memory_headroom_validator,
    config_schema=PolicyConfigSchema(
        properties={"maxGpuMemoryUtilization": {"type": "number", "default": 0.95, "maximum": 1}}
    ),
)
