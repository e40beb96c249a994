"""Paid capacity: GPU node groups whose paid GPUs the pools on them would mostly leave idle at peak.

paid-gpu-utilisation reads the stack file the program deploys (the ``llmfleet-spec`` ConfigMap, as
monthly-cost-ceiling does), packs every pool's peak replicas onto the whole nodes of its group
(`fleet.capacity.paid`), and reports each GPU node group of the graph whose used / paid GPUs at peak is under
the target (default: the seed's 70%). Its message names the options with the figure each would give.
Advisory: a small pool on 8-GPU nodes is a cost choice, not a fault.
"""

from __future__ import annotations

from collections.abc import Iterable

import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.capacity.paid import PAID_GPU_UTILISATION_TARGET, paid_options, plan_groups
from fleet.protocol import contract
from fleet.spec.errors import SpecError
from fleet.spec.loader import parse_spec
from fleet.spec.stack import FleetSpec
from policies.common import (
    NODE_GROUP,
    PRODUCTION_SCHEMA,
    as_float,
    environment,
    get_path,
    is_gpu_node_group,
    mapping,
    sequence,
)

__all__ = ["deployed_specs", "paid_gpu_utilisation"]

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def deployed_specs(resources: Iterable[PolicyResource]) -> list[FleetSpec]:
    """The fleet specs of the stack files in the graph's ``llmfleet-spec`` ConfigMaps (invalid ones skipped)."""
    specs: list[FleetSpec] = []
    for resource in resources:
        props = resource.props
        if resource.resource_type != CONFIG_MAP or get_path(props, "metadata", "name") != contract.SPEC_CONFIGMAP:
            continue
        for text in mapping(props.get("data")).values():
            try:
                specs.append(parse_spec(yaml.safe_load(str(text))).spec)
            except (yaml.YAMLError, SpecError):
                continue  # The program validated it before rendering; nothing to plan from a broken copy.
    return specs


def paid_gpu_utilisation_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    config = args.get_config()
    target = as_float(config.get("targetUtilisation"))
    target = PAID_GPU_UTILISATION_TARGET if target is None else target
    production = {str(e) for e in sequence(config.get("productionEnvironments"))}
    urns: dict[tuple[str, str], str] = {}
    for resource in args.resources:
        if resource.resource_type == NODE_GROUP and is_gpu_node_group(resource.props):
            group = str(mapping(resource.props.get("tags")).get(contract.TAG_GPU_GROUP, ""))
            urns.setdefault((environment(resource.props), group), resource.urn)
    for spec in deployed_specs(args.resources):
        for plan in plan_groups(spec):
            urn = urns.get((spec.environment, plan.group))
            peak, low = plan.at_peak, plan.at_min
            if urn is None or peak.paid_utilisation >= target:
                continue
            options = paid_options(spec, plan, production=spec.environment in production, target=target)
            report_violation(
                f"stack {spec.environment!r}: GPU node group {plan.group!r} ({plan.instance_type}, "
                f"{plan.gpus_per_node} GPUs a node, {len(plan.zones)} zones) pays for {peak.paid_gpus} GPUs at peak "
                f"and its pools use {peak.used_gpus} ({peak.paid_utilisation:.0%}, target {target:.0%}); at min "
                f"{low.used_gpus} of {low.paid_gpus} ({low.paid_utilisation:.0%}), ${peak.monthly_cost_usd:,.0f}/month "
                "at peak. Risk: most of the GPU bill buys idle GPUs, and scaling replicas saves nothing. Options: "
                + "; ".join(o.text for o in options)
                + ".",
                urn,
            )


paid_gpu_utilisation = StackValidationPolicy(
    name="paid-gpu-utilisation",
    description="The pools on each GPU node group use at least the target share of its paid GPUs at peak.",
    validate=paid_gpu_utilisation_validator,
    enforcement_level=EnforcementLevel.ADVISORY,
    config_schema=PolicyConfigSchema(
        properties={
            "targetUtilisation": {
                "type": "number",
                "default": PAID_GPU_UTILISATION_TARGET,
                "description": "used / paid GPUs at peak below which the policy reports (the seed's 70%)",
            },
            **PRODUCTION_SCHEMA,
        }
    ),
)
