"""Network rules: the gateway is the only Service reachable from outside the cluster."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from fleet import contract
from policies.common import SERVICE, annotations_of, get_path, labels, sequence

__all__ = ["is_public_service", "only_gateway_public"]

_INTERNAL = (
    ("service.beta.kubernetes.io/aws-load-balancer-internal", "true"),
    ("service.beta.kubernetes.io/aws-load-balancer-scheme", "internal"),
)


def is_public_service(props: object) -> bool:
    """LoadBalancer (unless marked internal), NodePort, or external IPs: reachable from outside."""
    kind = get_path(props, "spec", "type") or "ClusterIP"
    if sequence(get_path(props, "spec", "externalIPs")):
        return True
    if kind == "NodePort":
        return True
    if kind != "LoadBalancer":
        return False
    ann = annotations_of(props)
    return not any(str(ann.get(key, "")).lower() == value for key, value in _INTERNAL)


def only_gateway_public_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != SERVICE or not is_public_service(args.props):
        return
    if labels(args.props).get(contract.LABEL_COMPONENT) == contract.COMPONENT_GATEWAY:
        return
    name = get_path(args.props, "metadata", "name") or args.name
    component = labels(args.props).get(contract.LABEL_COMPONENT, "unlabelled")
    report_violation(
        f"Service {name!r} ({component}) is exposed outside the cluster; only the gateway may be. Risk: clients "
        "bypass authentication, tenant quotas and backpressure and reach engines or the control plane directly.",
        None,
    )


only_gateway_public = ResourceValidationPolicy(
    name="only-gateway-public",
    description="Only the gateway Service is exposed outside the cluster.",
    validate=only_gateway_public_validator,
    enforcement_level=EnforcementLevel.MANDATORY,
)
