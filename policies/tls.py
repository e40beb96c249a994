"""TLS rule: a listener reachable from outside the cluster speaks TLS, never plain HTTP."""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from fleet.protocol import contract
from policies.common import SERVICE, annotations_of, get_path, mapping, sequence
from policies.network import is_public_service

__all__ = ["public_listener_tls", "unencrypted_ports"]

_LB = "service.beta.kubernetes.io/aws-load-balancer"


def unencrypted_ports(props: object) -> list[str]:
    """The ports of a Service that carry plain traffic: all of them unless the load balancer terminates TLS on
    them (an ``-ssl-cert`` with ``-ssl-ports`` naming each, or ``*``) or the pods do (``llmfleet.io/tls:
    gateway``, set by the program when the gateway serves HTTPS itself)."""
    ann = annotations_of(props)
    # Numbers arrive as floats from the engine (443.0): compare ports as integers' text.
    ports = [{**mapping(p), "port": _port(mapping(p).get("port"))} for p in sequence(get_path(props, "spec", "ports"))]
    if ann.get(contract.ANN_TLS) == "gateway":
        return []
    if ann.get(f"{_LB}-ssl-cert"):
        listed = {p.strip() for p in str(ann.get(f"{_LB}-ssl-ports", "*")).split(",")}
        if "*" in listed:
            return []
        return [str(p.get("port")) for p in ports if str(p.get("port")) not in listed and p.get("name") not in listed]
    return [str(p.get("port")) for p in ports]


def _port(value: object) -> str:
    return str(int(value)) if isinstance(value, int | float) else str(value)


def public_listener_tls_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != SERVICE or not is_public_service(args.props):
        return
    plain = unencrypted_ports(args.props)
    if plain:
        name = get_path(args.props, "metadata", "name") or args.name
        report_violation(
            f"Service {name!r} is reachable from outside the cluster over plain HTTP on port(s) {', '.join(plain)}. "
            "Risk: tenants' API keys and prompts cross the internet in clear text. Set gateway.tls.certificateArn "
            "(aws: TLS on the NLB) or gateway.tls.secretName (the gateway serves HTTPS).",
            None,
        )


public_listener_tls = ResourceValidationPolicy(
    name="public-listener-tls",
    description="Every port of a Service reachable from outside the cluster terminates TLS.",
    validate=public_listener_tls_validator,
)
