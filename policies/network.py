"""Network rules: the gateway is the only Service reachable from outside the cluster, and inside the cluster
engines take connections only from the gateway, the control plane and the metrics scraper; other engines reach an
engine only on ports that are none of its API's, its agent's or its KV events' (NIXL's side channel, which a decode
engine of a prefill/decode pool opens on a prefill engine: `infra.network_policies`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.protocol import contract
from policies.common import SERVICE, annotations_of, get_path, is_engine, labels, mapping, sequence

__all__ = ["is_public_service", "network_default_deny", "only_gateway_public"]

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
)


NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
# Who may open connections to engine pods: pods of these components in the namespace, or a named namespace
# (the Prometheus scraper's).
ENGINE_CLIENTS = frozenset({contract.COMPONENT_GATEWAY, contract.COMPONENT_CONTROL_PLANE})
# What another engine may never reach on an engine: vLLM's API, the agent, the KV events.
ENGINE_OWN_PORTS = frozenset({contract.ENGINE_PORT, contract.AGENT_PORT, contract.KV_EVENTS_PORT})


def _namespace(props: object) -> str:
    return str(get_path(props, "metadata", "namespace") or "default")


def _selects(selector: object, pod_labels: Mapping[str, Any]) -> bool:
    """Whether a label selector (matchLabels only; matchExpressions count as selecting) selects ``pod_labels``."""
    match = mapping(get_path(selector, "matchLabels"))
    return all(pod_labels.get(k) == v for k, v in match.items())


def _is_default_deny(props: object) -> bool:
    selector = mapping(get_path(props, "spec", "podSelector"))
    types = [str(t) for t in sequence(get_path(props, "spec", "policyTypes"))] or ["Ingress"]
    return (
        not mapping(selector.get("matchLabels"))
        and not sequence(selector.get("matchExpressions"))
        and "Ingress" in types
        and not sequence(get_path(props, "spec", "ingress"))
    )


def _engine_side_ports(peer: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
    """Whether ``peer`` is engine pods admitted by ``rule`` on named ports that none of `ENGINE_OWN_PORTS` is."""
    component = mapping(get_path(peer, "podSelector", "matchLabels")).get(contract.LABEL_COMPONENT)
    ports = [mapping(p).get("port") for p in sequence(rule.get("ports"))]
    return (
        component == contract.COMPONENT_ENGINE
        and bool(ports)
        and all(isinstance(p, int | float) and int(p) not in ENGINE_OWN_PORTS for p in ports)
        and not any(mapping(p).get("endPort") is not None for p in sequence(rule.get("ports")))
    )


def _peer_problem(peer: Mapping[str, Any]) -> str | None:
    """Why ``peer`` (one ``from`` entry) admits more than gateways, the control plane and a named namespace."""
    if peer.get("ipBlock") is not None:
        return f"an ipBlock ({get_path(peer, 'ipBlock', 'cidr')})"
    namespaces = peer.get("namespaceSelector")
    if namespaces is not None:
        if not mapping(get_path(namespaces, "matchLabels")) and not sequence(get_path(namespaces, "matchExpressions")):
            return "every namespace (an empty namespaceSelector)"
        return None
    component = mapping(get_path(peer, "podSelector", "matchLabels")).get(contract.LABEL_COMPONENT)
    if component not in ENGINE_CLIENTS:
        return f"pods of component {component or 'any'!r}"
    return None


def _engine_ingress_problems(policies: list[Any], pod_labels: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for policy in policies:
        if not _selects(get_path(policy.props, "spec", "podSelector"), pod_labels):
            continue
        name = get_path(policy.props, "metadata", "name") or policy.name
        for rule in sequence(get_path(policy.props, "spec", "ingress")):
            peers = [mapping(p) for p in sequence(mapping(rule).get("from"))]
            if not peers:
                problems.append(f"NetworkPolicy {name!r} admits any source")
            problems += [
                f"NetworkPolicy {name!r} admits {why}"
                for p in peers
                if not _engine_side_ports(p, mapping(rule)) and (why := _peer_problem(p))
            ]
    return problems


def network_default_deny_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    by_namespace: dict[str, list[Any]] = {}
    for resource in args.resources:
        if resource.resource_type == NETWORK_POLICY:
            by_namespace.setdefault(_namespace(resource.props), []).append(resource)
    for resource in args.resources:
        if not is_engine(resource.resource_type, resource.props):
            continue
        namespace = _namespace(resource.props)
        policies = by_namespace.get(namespace, [])
        name = get_path(resource.props, "metadata", "name") or resource.name
        if not any(_is_default_deny(p.props) for p in policies):
            report_violation(
                f"namespace {namespace!r} runs engine Deployment {name!r} but has no default-deny ingress "
                "NetworkPolicy (empty podSelector, no ingress rule). Risk: any pod in the cluster reaches the "
                "engines directly, bypassing the gateway's authentication, tenant quotas and backpressure.",
                resource.urn,
            )
            continue
        pod_labels = mapping(get_path(resource.props, "spec", "template", "metadata", "labels"))
        problems = _engine_ingress_problems(policies, pod_labels)
        if problems:
            report_violation(
                f"engine pods of {name!r} are reachable from more than the gateway, the control plane and the "
                f"metrics scraper: {'; '.join(problems)}. Risk: unauthenticated clients send completions straight "
                "to vLLM or fake agent reports, skipping tenant quotas and routing.",
                resource.urn,
            )


network_default_deny = StackValidationPolicy(
    name="network-default-deny",
    description=(
        "A namespace running engines denies ingress by default, and engines admit only gateways, the control "
        "plane and the metrics scraper's namespace (other engines: on none of the engine's own ports)."
    ),
    validate=network_default_deny_validator,
)
