"""Pod security rules: engine pods run as a non-root user and cannot gain privileges."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from policies.common import as_int, get_path, is_engine, mapping, pod_spec, sequence

__all__ = ["engines_run_as_non_root", "root_problems"]


def _true(value: object) -> bool:
    return value is True or str(value).lower() == "true"


def root_problems(pod: Mapping[str, Any]) -> list[str]:
    """What lets a container of ``pod`` run as root or gain privileges (container settings override the pod's)."""
    pod_context = mapping(pod.get("securityContext"))
    problems: list[str] = []
    for key in ("initContainers", "containers"):
        for item in sequence(pod.get(key)):
            container = mapping(item)
            context = mapping(container.get("securityContext"))
            name = container.get("name") or "?"
            user = as_int(context.get("runAsUser", pod_context.get("runAsUser")))
            non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
            if user == 0:
                problems.append(f"{name!r} runs as uid 0")
            elif not _true(non_root):
                problems.append(f"{name!r} does not set runAsNonRoot")
            if not (
                context.get("allowPrivilegeEscalation") is False or _false(context.get("allowPrivilegeEscalation"))
            ):
                problems.append(f"{name!r} may escalate privileges (allowPrivilegeEscalation is not false)")
            if _true(context.get("privileged")):
                problems.append(f"{name!r} is privileged")
    return problems


def _false(value: object) -> bool:
    return str(value).lower() == "false"


def engines_run_as_non_root_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not is_engine(args.resource_type, args.props):
        return
    problems = root_problems(pod_spec(args.props))
    if problems:
        name = get_path(args.props, "metadata", "name") or args.name
        report_violation(
            f"engine Deployment {name!r}: {'; '.join(problems)}. Risk: engines load third-party model code and "
            "serve tenants' prompts; a compromised engine running as root owns the node's model cache and "
            "driver files and is one kernel or runtime flaw away from the node and its GPUs.",
            None,
        )


engines_run_as_non_root = ResourceValidationPolicy(
    name="engines-run-as-non-root",
    description="Engine pods (init containers included) run as non-root without privilege escalation.",
    validate=engines_run_as_non_root_validator,
)
