"""Cost rules: instance types from an allowed list; GPU spend at full scale-out under the stack's ceiling.

monthly-cost-ceiling reads the ceiling and the GPU-hour price from the stack file the program deploys: the
``llmfleet-spec`` ConfigMap holds the spec every container loads, ``llmfleet:cost`` included, so the policy
checks the numbers the stack declares rather than a copy kept in the pack. Policy config may override both per
environment. Every GPU node group counts at its maximum size, whatever its capacity type, at the stack's
GPU-hour price or else the catalogue's on-demand price of its instance type in the stack's region (spot at that
ceiling: `fleet.capacity.catalog.instance_hour_usd`); a capacity-block group names no instance types, so its instance
type
comes from its launch template (same environment, group and zone tags).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pulumi_policy import (
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.capacity.catalog import GPUS, INSTANCES, instance_hour_usd
from fleet.capacity.plan import HOURS_PER_MONTH
from fleet.protocol import contract
from fleet.spec.loader import NAMESPACE
from policies.common import (
    LAUNCH_TEMPLATE,
    NODE_GROUP,
    as_float,
    as_int,
    environment,
    get_path,
    is_gpu_node_group,
    labels,
    mapping,
    sequence,
)

__all__ = [
    "DEFAULT_ALLOWED_INSTANCE_TYPES",
    "StackCost",
    "allowed_instance_types",
    "monthly_cost_ceiling",
    "node_group_instance_type",
    "node_group_max_cost",
    "stack_costs",
]

DEFAULT_ALLOWED_INSTANCE_TYPES = sorted(
    {*INSTANCES, *(f"{family}.{size}" for family in ("m6i", "m7i") for size in ("xlarge", "2xlarge", "4xlarge"))}
)
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


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


@dataclass(frozen=True)
class StackCost:
    """A stack's ``llmfleet:cost`` as deployed: the monthly ceiling and the GPU-hour price (None: unset), and
    the region its catalogue prices are read for."""

    monthly_ceiling_usd: float | None = None
    gpu_hour_usd: float | None = None
    region: str = "us-east-1"


def stack_costs(resources: Iterable[PolicyResource]) -> dict[str, StackCost]:
    """Environment -> the cost block of the stack file in its ``llmfleet-spec`` ConfigMap."""
    found: dict[str, StackCost] = {}
    for resource in resources:
        props = resource.props
        if resource.resource_type != CONFIG_MAP or get_path(props, "metadata", "name") != contract.SPEC_CONFIGMAP:
            continue
        for text in mapping(props.get("data")).values():
            try:
                config = mapping(mapping(yaml.safe_load(str(text))).get("config"))
            except yaml.YAMLError:
                continue
            env = str(labels(props).get(contract.LABEL_ENVIRONMENT) or config.get(f"{NAMESPACE}:environment") or "")
            cost = mapping(config.get(f"{NAMESPACE}:cost"))
            region = str(config.get("aws:region") or "us-east-1")
            found[env] = StackCost(as_float(cost.get("monthlyCeilingUsd")), as_float(cost.get("gpuHourUsd")), region)
    return found


def _group_key(props: Any) -> tuple[str, str, str]:
    tags = mapping(mapping(props).get("tags"))
    return environment(props), str(tags.get(contract.TAG_GPU_GROUP, "")), str(tags.get(contract.TAG_ZONE, ""))


def node_group_instance_type(props: Any, templates: Mapping[tuple[str, str, str], str]) -> str | None:
    """The node group's instance type: its first ``instanceTypes`` entry, else its launch template's
    (capacity blocks), matched by environment, GPU group and zone tags."""
    types = [str(t) for t in sequence(mapping(props).get("instanceTypes"))]
    if types:
        return types[0]
    return templates.get(_group_key(props))


def node_group_max_cost(
    props: Any, instance_type: str, gpu_hour_usd: float | None = None, region: str = "us-east-1"
) -> float:
    """USD per month of a GPU node group of ``instance_type`` running at ``maxSize``: at ``gpu_hour_usd`` per GPU,
    else the catalogue's on-demand price of the instance in ``region``, else its GPU's price."""
    instance = INSTANCES[instance_type]
    nodes = as_int(mapping(mapping(props).get("scalingConfig")).get("maxSize"), 0) or 0
    if gpu_hour_usd is not None:
        node_hour = gpu_hour_usd * instance.gpu_count
    else:
        listed = instance_hour_usd(instance_type, region)
        node_hour = listed.usd if listed is not None else GPUS[instance.gpu].hour_usd * instance.gpu_count
    return nodes * node_hour * HOURS_PER_MONTH


def monthly_cost_ceiling_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    config = args.get_config()
    overrides = {str(k): float(v) for k, v in mapping(config.get("monthlyCeilingUsd")).items()}
    price_override = as_float(config.get("gpuHourUsd"))
    stacks = stack_costs(args.resources)
    templates = {
        _group_key(r.props): str(r.props.get("instanceType"))
        for r in args.resources
        if r.resource_type == LAUNCH_TEMPLATE and r.props.get("instanceType")
    }
    totals: dict[str, float] = defaultdict(float)
    unpriced: dict[str, list[str]] = defaultdict(list)
    for resource in args.resources:
        if resource.resource_type != NODE_GROUP or not is_gpu_node_group(resource.props):
            continue
        env = environment(resource.props)
        instance = node_group_instance_type(resource.props, templates)
        if instance is None or instance not in INSTANCES:
            unpriced[env].append(resource.name)
            continue
        stack = stacks.get(env, StackCost())
        price = price_override if price_override is not None else stack.gpu_hour_usd
        totals[env] += node_group_max_cost(resource.props, instance, price, stack.region)
    for env in sorted(set(totals) | set(unpriced)):
        ceiling = overrides.get(env, stacks.get(env, StackCost()).monthly_ceiling_usd)
        if ceiling is None:
            continue
        if unpriced[env]:
            report_violation(
                f"stack {env!r}: GPU node groups {sorted(unpriced[env])} have no instance type the catalogue "
                f"prices, so their cost against the ${ceiling:,.0f} ceiling is unknown. Risk: capacity nobody "
                "priced joins the bill.",
                None,
            )
        total = totals[env]
        if total > ceiling:
            report_violation(
                f"stack {env!r}: GPU node groups at their maximum size cost ${total:,.0f}/month, above the "
                f"${ceiling:,.0f} ceiling. Risk: the autoscaler can run up a bill nobody approved.",
                None,
            )


allowed_instance_types = ResourceValidationPolicy(
    name="allowed-instance-types",
    description="Node groups use instance types from the allowed list.",
    validate=allowed_instance_types_validator,
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
    description="GPU node groups at maximum size stay under the monthly ceiling the stack file declares.",
    validate=monthly_cost_ceiling_validator,
    config_schema=PolicyConfigSchema(
        properties={
            "monthlyCeilingUsd": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "USD per month per environment (default: the stack's cost.monthlyCeilingUsd; "
                "an environment with neither has no ceiling)",
            },
            "gpuHourUsd": {
                "type": "number",
                "description": "price per GPU-hour (default: the stack's cost.gpuHourUsd, else the catalogue's)",
            },
        }
    ),
)
