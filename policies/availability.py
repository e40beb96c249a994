"""Availability rules: engine PDBs, probes, drain timing, production minimum replicas and capacity buffer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.protocol import contract
from fleet.spec.stack import DRAIN_MARGIN_S
from policies.common import (
    PDB,
    PRODUCTION_SCHEMA,
    annotations_of,
    as_float,
    as_int,
    containers,
    get_path,
    is_engine,
    is_production,
    mapping,
    pod_spec,
    sequence,
)

__all__ = [
    "engine_grace_covers_drain",
    "engine_has_pdb",
    "engine_has_probes",
    "prod_capacity_buffer",
    "prod_min_replicas",
    "pre_stop_seconds",
]

_SLEEP = re.compile(r"\bsleep\s+(\d+(?:\.\d+)?)")


def engine_has_pdb_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    budgets: list[tuple[str, Mapping[str, Any]]] = []
    for resource in args.resources:
        if resource.resource_type == PDB:
            namespace = str(get_path(resource.props, "metadata", "namespace") or "default")
            budgets.append((namespace, mapping(get_path(resource.props, "spec", "selector", "matchLabels"))))
    for resource in args.resources:
        if not is_engine(resource.resource_type, resource.props):
            continue
        namespace = str(get_path(resource.props, "metadata", "namespace") or "default")
        pod_labels = mapping(get_path(resource.props, "spec", "template", "metadata", "labels"))
        covered = any(
            ns == namespace and selector and all(pod_labels.get(k) == v for k, v in selector.items())
            for ns, selector in budgets
        )
        if not covered:
            name = get_path(resource.props, "metadata", "name") or resource.name
            report_violation(
                f"engine Deployment {name!r} has no PodDisruptionBudget selecting its pods. Risk: a node "
                "upgrade or scale-in evicts every replica at once and the pool serves nothing while models reload.",
                resource.urn,
            )


def engine_has_probes_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    for container in containers(args.props):
        missing = [p for p in ("startupProbe", "readinessProbe", "livenessProbe") if not container.get(p)]
        if missing:
            report_violation(
                f"container {container.get('name')!r} lacks {', '.join(missing)}. Risk: traffic reaches an engine "
                "still loading weights, or a hung engine is never restarted.",
                None,
            )


def pre_stop_seconds(container: Mapping[str, Any]) -> float:
    """Seconds a container's preStop hook waits: a ``sleep`` action, or an exec running ``sleep N``."""
    pre_stop = mapping(get_path(container, "lifecycle", "preStop"))
    seconds = as_float(get_path(pre_stop, "sleep", "seconds"))
    if seconds is not None:
        return seconds
    command = " ".join(str(part) for part in sequence(get_path(pre_stop, "exec", "command")))
    match = _SLEEP.search(command)
    return float(match.group(1)) if match else 0.0


def engine_grace_covers_drain_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    grace = as_float(pod_spec(args.props).get("terminationGracePeriodSeconds"), 30.0) or 0.0
    shutdown = as_float(annotations_of(args.props).get(contract.ANN_SHUTDOWN_TIMEOUT))
    if shutdown is None:
        report_violation(
            f"engine Deployment lacks the {contract.ANN_SHUTDOWN_TIMEOUT} annotation, so its termination grace "
            "cannot be checked. Risk: the kubelet kills engines mid-request during a drain.",
            None,
        )
        return
    # The agent waits the propagation delay itself before it stops the engine; a preStop that sleeps waits it
    # again before the agent even hears of the drain. Both come out of the same grace.
    propagation = as_float(annotations_of(args.props).get(contract.ANN_DRAIN_PROPAGATION), 0.0) or 0.0
    for container in containers(args.props):
        pre_stop = pre_stop_seconds(container)
        needed = pre_stop + propagation + shutdown + DRAIN_MARGIN_S
        if grace < needed:
            report_violation(
                f"terminationGracePeriodSeconds {grace:g} < preStop {pre_stop:g} s + agent propagation wait "
                f"{propagation:g} s + engine shutdown timeout {shutdown:g} s + {DRAIN_MARGIN_S:g} s margin "
                f"= {needed:g} s. Risk: SIGKILL arrives while in-flight requests are still decoding; clients see "
                "dropped streams on every scale-down and rollout.",
                None,
            )


def prod_min_replicas_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    config = args.get_config()
    if not is_production(args.props, config):
        return
    minimum = int(config.get("minReplicas", 2))
    declared = as_int(annotations_of(args.props).get(contract.ANN_MIN_REPLICAS))
    replicas = declared if declared is not None else as_int(get_path(args.props, "spec", "replicas"), 1)
    if replicas is not None and replicas < minimum:
        report_violation(
            f"production pool minimum is {replicas} replica(s); at least {minimum} are required. Risk: one pod "
            "restart, node failure or restart window leaves the model with no serving replica.",
            None,
        )


def prod_capacity_buffer_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    config = args.get_config()
    if not is_production(args.props, config):
        return
    minimum = float(config.get("minCapacityBuffer", 0.3))
    buffer = as_float(annotations_of(args.props).get(contract.ANN_CAPACITY_BUFFER))
    if buffer is None or buffer < minimum:
        shown = "none declared" if buffer is None else f"{1 + buffer:g}x"
        report_violation(
            f"production pool is sized with a capacity buffer of {shown}; at least {1 + minimum:g}x peak is "
            "advised. Risk: a traffic spike or a lost zone pushes queues past the TTFT SLO before new replicas "
            "finish their cold start.",
            None,
        )


engine_has_pdb = StackValidationPolicy(
    name="engine-has-pdb",
    description="Every engine Deployment has a PodDisruptionBudget selecting its pods.",
    validate=engine_has_pdb_validator,
)

engine_has_probes = ResourceValidationPolicy(
    name="engine-has-probes",
    description="Engine containers have startup, readiness and liveness probes.",
    validate=engine_has_probes_validator,
)

engine_grace_covers_drain = ResourceValidationPolicy(
    name="engine-grace-covers-drain",
    description="terminationGracePeriodSeconds >= preStop sleep + engine shutdown timeout.",
    validate=engine_grace_covers_drain_validator,
)

prod_min_replicas = ResourceValidationPolicy(
    name="prod-min-replicas",
    description="Production pools keep at least two replicas.",
    validate=prod_min_replicas_validator,
    config_schema=PolicyConfigSchema(
        properties={**PRODUCTION_SCHEMA, "minReplicas": {"type": "integer", "default": 2}}
    ),
)

prod_capacity_buffer = ResourceValidationPolicy(
    name="prod-capacity-buffer",
    description="Production pools are sized for at least 1.3x peak (workload.capacityBuffer >= 0.3).",
    validate=prod_capacity_buffer_validator,
    enforcement_level=EnforcementLevel.ADVISORY,
    config_schema=PolicyConfigSchema(
        properties={**PRODUCTION_SCHEMA, "minCapacityBuffer": {"type": "number", "default": 0.3}}
    ),
)
