"""Cost rules: instance types from an allowed list; GPU spend at full scale-out under a ceiling per stack."""

from __future__ import annotations

from collections import defaultdict

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.capacity import HOURS_PER_MONTH
from fleet.catalog import GPUS, INSTANCES
from policies.common import LAUNCH_TEMPLATE, NODE_GROUP, as_int, environment, is_gpu_node_group, mapping, sequence

__all__ = ["DEFAULT_ALLOWED_INSTANCE_TYPES", "allowed_instance_types", "monthly_cost_ceiling", "node_group_max_cost"]

DEFAULT_ALLOWED_INSTANCE_TYPES = sorted(
    {*INSTANCES, *(f"{family}.{size}" for family in ("m6i", "m7i") for size in ("xlarge", "2xlarge", "4xlarge"))}
)
DEFAULT_CEILINGS = {"prod": 250_000, "staging": 60_000}


def allowed_instance_types_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type == NODE_GROUP:
        types = [str(t) for t in sequence(args.props.get("instanceTypes"))]
    elif args.resource_type == LAUNCH_TEMPLATE and args.props.get("instanceType"):
        types = [str(args.props.get("instanceType"))]
    else:
        return
    allowed = set(args.get_config().get("allowedInstanceTypes", DEFAULT_ALLOWED_INSTANCE_TYPES))
    for instance in types:
        if instance not in allowed:
            report_violation(
                f"instance type {instance!r} is not in the allowed list. Risk: unreviewed hardware (wrong GPU, "
                "too little GPU memory or NVMe, unplanned cost) enters the fleet.",
                None,
            )


def node_group_max_cost(props: object, gpu_hour_usd: float | None = None) -> float:
    """USD per month of a GPU node group running at ``maxSize`` (catalogue price per GPU-hour by default)."""
    instances = [INSTANCES[str(t)] for t in sequence(mapping(props).get("instanceTypes")) if str(t) in INSTANCES]
    if not instances:
        return 0.0
    instance = instances[0]
    price = gpu_hour_usd if gpu_hour_usd is not None else GPUS[instance.gpu].hour_usd
    nodes = as_int(mapping(mapping(props).get("scalingConfig")).get("maxSize"), 0) or 0
    return nodes * instance.gpu_count * price * HOURS_PER_MONTH


def monthly_cost_ceiling_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    config = args.get_config()
    ceilings = {str(k): float(v) for k, v in mapping(config.get("monthlyCeilingUsd", DEFAULT_CEILINGS)).items()}
    price = config.get("gpuHourUsd")
    totals: dict[str, float] = defaultdict(float)
    for resource in args.resources:
        if resource.resource_type == NODE_GROUP and is_gpu_node_group(resource.props):
            totals[environment(resource.props)] += node_group_max_cost(
                resource.props, None if price is None else float(price)
            )
    for env, total in sorted(totals.items()):
        ceiling = ceilings.get(env)
        if ceiling is not None and total > ceiling:
            report_violation(
                f"stack {env!r}: GPU node groups at their maximum size cost ${total:,.0f}/month, above the "
                f"${ceiling:,.0f} ceiling. Risk: the autoscaler can run up a bill nobody approved.",
                None,
            )


allowed_instance_types = ResourceValidationPolicy(
    name="allowed-instance-types",
    description="Node groups use instance types from the allowed list.",
    validate=allowed_instance_types_validator,
    enforcement_level=EnforcementLevel.MANDATORY,
    config_schema=PolicyConfigSchema(
        properties={
            "allowedInstanceTypes": {
                "type": "array",
                "items": {"type": "string"},
                "default": DEFAULT_ALLOWED_INSTANCE_TYPES,
            }
        }
    ),
)

monthly_cost_ceiling = StackValidationPolicy(
    name="monthly-cost-ceiling",
    description="GPU node groups at maximum size stay under the stack's monthly ceiling.",
    validate=monthly_cost_ceiling_validator,
    enforcement_level=EnforcementLevel.MANDATORY,
    config_schema=PolicyConfigSchema(
        properties={
            "monthlyCeilingUsd": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "default": DEFAULT_CEILINGS,
                "description": "USD per month per environment; environments not listed have no ceiling",
            },
            "gpuHourUsd": {"type": "number", "description": "price per GPU-hour (default: the catalogue's)"},
        }
    ),
)
