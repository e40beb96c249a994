"""Timing rules: the gateway's request timeout against the NLB listener, and shutdowns against what is in flight.

* ``request-timeout-fits-listener``: the gateway Service's request timeout (``llmfleet.io/request-timeout-
  seconds``) plus a 10 s margin fits the idle timeout of its NLB listener: 350 s on a TLS listener (fixed by AWS),
  else the ``tcp.idle_timeout.seconds`` listener attribute (350 s when unset). Else a non-streamed response is
  cut while it is still being generated.
* ``gateway-drain-covers-deregistration``: a pod behind an NLB target group keeps listening (its preStop sleep plus
  the gateway's own ``--drain-propagation``) at least
  as long as the NLB keeps sending it new connections: about 120 s whatever the delay
  (kubernetes-sigs/aws-load-balancer-controller#2366), and the group's deregistration delay (300 s by default);
  its termination grace then leaves the request timeout for in-flight requests.
* ``engine-grace-covers-longest-request``: a real engine's shutdown timeout (``llmfleet.io/engine-shutdown-timeout-
  seconds``) is at least the longest request the gateway lets run, unless its pool resumes interrupted streams
  (``llmfleet.io/resume-streams: "true"``). Else every scale-down and restart window cuts long generations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs, StackValidationPolicy

from fleet.protocol import contract
from fleet.protocol.marks import (
    ANN_RESUME_STREAMS,
    LB_DEREGISTRATION_DELAY,
    NLB_DEFAULT_DEREGISTRATION_DELAY_S,
    NLB_DEREGISTRATION_S,
    NLB_TLS_IDLE_TIMEOUT_S,
)
from fleet.spec.stack import DRAIN_MARGIN_S
from fleet.spec.validate_timing import NLB_IDLE_MARGIN_S
from policies.availability import pre_stop_seconds
from policies.common import (
    DEPLOYMENT,
    SERVICE,
    annotations_of,
    as_float,
    containers,
    get_path,
    is_engine,
    labels,
    mapping,
    pod_spec,
    sequence,
)

__all__ = [
    "engine_grace_covers_longest_request",
    "gateway_drain_covers_deregistration",
    "listener_idle_timeouts",
    "request_timeout_fits_listener",
]

_LB = "service.beta.kubernetes.io/aws-load-balancer"
_CONTROLLER_LB_TYPES = frozenset({"external", "nlb-ip"})
_ATTRIBUTE = re.compile(r"\s*([^=,\s]+)\s*=\s*([^,]*)")


def _attributes(text: Any) -> dict[str, str]:
    """``k1=v1,k2=v2`` (the controller's attribute annotations) as a dict."""
    return {m.group(1): m.group(2).strip() for m in _ATTRIBUTE.finditer(str(text or ""))}


def _behind_nlb(service: PolicyResource) -> bool:
    return str(annotations_of(service.props).get(f"{_LB}-type", "")) in _CONTROLLER_LB_TYPES


def listener_idle_timeouts(service: Mapping[str, Any]) -> dict[int, float]:
    """Port -> idle timeout of each NLB listener a controller-managed Service gets (props as CrossGuard sees them)."""
    annotations = annotations_of(service)
    ssl_ports = {p.strip() for p in str(annotations.get(f"{_LB}-ssl-ports", "*")).split(",")}
    has_cert = bool(annotations.get(f"{_LB}-ssl-cert"))
    out: dict[int, float] = {}
    for port in sequence(get_path(service, "spec", "ports")):
        number = int(as_float(mapping(port).get("port"), 0) or 0)
        if has_cert and ("*" in ssl_ports or str(number) in ssl_ports):
            out[number] = float(NLB_TLS_IDLE_TIMEOUT_S)  # fixed; the controller skips TLS listener attributes
            continue
        attributes = _attributes(annotations.get(f"{_LB}-listener-attributes.TCP-{number}"))
        idle = as_float(attributes.get("tcp.idle_timeout.seconds"), float(NLB_TLS_IDLE_TIMEOUT_S))
        out[number] = idle or 0.0
    return out


def _name(resource: PolicyResource) -> str:
    return str(get_path(resource.props, "metadata", "name") or resource.name)


def _request_timeout(service: PolicyResource) -> float | None:
    return as_float(annotations_of(service.props).get(contract.ANN_REQUEST_TIMEOUT))


def request_timeout_fits_listener_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for service in args.resources:
        if service.resource_type != SERVICE or not _behind_nlb(service):
            continue
        timeout = _request_timeout(service)
        if timeout is None:
            continue
        for port, idle in sorted(listener_idle_timeouts(service.props).items()):
            if timeout + NLB_IDLE_MARGIN_S > idle:
                report_violation(
                    f"Service {_name(service)!r} lets a request run {timeout:g} s, but its NLB listener on port "
                    f"{port} closes a connection idle for {idle:g} s (TLS listeners: fixed at "
                    f"{NLB_TLS_IDLE_TIMEOUT_S} s), less the {NLB_IDLE_MARGIN_S:g} s margin. Risk: a non-streamed "
                    "completion that is still generating is cut and the client sees a reset, not a response.",
                    service.urn,
                )


def _selects(service: PolicyResource, deployment: PolicyResource) -> bool:
    selector = mapping(get_path(service.props, "spec", "selector"))
    namespace = get_path(deployment.props, "metadata", "namespace")
    if not selector or get_path(service.props, "metadata", "namespace") != namespace:
        return False
    pod_labels = mapping(get_path(deployment.props, "spec", "template", "metadata", "labels"))
    return all(pod_labels.get(k) == v for k, v in selector.items())


def _deregistration_delay(service: PolicyResource) -> float:
    attributes = _attributes(annotations_of(service.props).get(f"{_LB}-target-group-attributes"))
    return as_float(attributes.get(LB_DEREGISTRATION_DELAY), float(NLB_DEFAULT_DEREGISTRATION_DELAY_S)) or 0.0


def listening_seconds(container: Mapping[str, Any]) -> float:
    """Seconds a stopping container keeps listening: its preStop sleep, then the gateway's ``--drain-propagation``
    (`gateway.drain`: it keeps serving that long after SIGTERM)."""
    args = [str(a) for a in sequence(container.get("args"))]
    propagation = 0.0
    if "--drain-propagation" in args[:-1]:
        propagation = as_float(args[args.index("--drain-propagation") + 1]) or 0.0
    return pre_stop_seconds(container) + propagation


def gateway_drain_covers_deregistration_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    services = [r for r in args.resources if r.resource_type == SERVICE and _behind_nlb(r)]
    deployments = [r for r in args.resources if r.resource_type == DEPLOYMENT]
    for service in services:
        needed = max(float(NLB_DEREGISTRATION_S), _deregistration_delay(service))
        requests = _request_timeout(service) or 0.0
        for deployment in (d for d in deployments if _selects(service, d)):
            grace = as_float(pod_spec(deployment.props).get("terminationGracePeriodSeconds"), 30.0) or 0.0
            for container in containers(deployment.props):
                listening = listening_seconds(container)
                if listening < needed:
                    report_violation(
                        f"Deployment {_name(deployment)!r} (container {container.get('name')!r}) stops listening "
                        f"{listening:g} s after it is told to stop (preStop sleep + --drain-propagation), but its "
                        "NLB target group keeps sending it new connections "
                        f"for about {needed:g} s (at least {NLB_DEREGISTRATION_S} s whatever the deregistration "
                        "delay, and the delay itself). Risk: every rollout and scale-in resets clients' new "
                        "connections.",
                        deployment.urn,
                    )
                elif grace < listening + requests + DRAIN_MARGIN_S:
                    report_violation(
                        f"Deployment {_name(deployment)!r} has terminationGracePeriodSeconds {grace:g} < listening "
                        f"{listening:g} s + request timeout {requests:g} s + {DRAIN_MARGIN_S:g} s. Risk: requests "
                        "accepted just before it stops listening are killed before they can finish.",
                        deployment.urn,
                    )


def _longest_request(resources: Iterable[PolicyResource]) -> float | None:
    timeouts = [
        t
        for r in resources
        if r.resource_type == SERVICE and labels(r.props).get(contract.LABEL_COMPONENT) == contract.COMPONENT_GATEWAY
        for t in [_request_timeout(r)]
        if t is not None
    ]
    return max(timeouts) if timeouts else None


def engine_grace_covers_longest_request_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    longest = _longest_request(args.resources)
    if longest is None:
        return
    for engine in args.resources:
        if not is_engine(engine.resource_type, engine.props):
            continue
        annotations = annotations_of(engine.props)
        if annotations.get(contract.ANN_ENGINE_KIND) == "sim" or annotations.get(ANN_RESUME_STREAMS) == "true":
            continue  # a simulator serves no real tokens; resumed streams continue on another replica
        shutdown = as_float(annotations.get(contract.ANN_SHUTDOWN_TIMEOUT), 0.0) or 0.0
        if shutdown < longest:
            report_violation(
                f"engine Deployment {_name(engine)!r} gives in-flight requests {shutdown:g} s when it drains, but the "
                f"gateway lets a request run {longest:g} s, and the pool does not resume streams. Risk: every "
                "scale-down, restart window and rollout cuts the longest generations mid-way.",
                engine.urn,
            )


request_timeout_fits_listener = StackValidationPolicy(
    name="request-timeout-fits-listener",
    description="The gateway's request timeout fits its NLB listener's idle timeout (350 s, fixed, on TLS).",
    validate=request_timeout_fits_listener_validator,
)

gateway_drain_covers_deregistration = StackValidationPolicy(
    name="gateway-drain-covers-deregistration",
    description=(
        "Pods behind an NLB keep listening through the target group's deregistration (>= 120 s and its delay), "
        "and their grace leaves the request timeout after it."
    ),
    validate=gateway_drain_covers_deregistration_validator,
)

engine_grace_covers_longest_request = StackValidationPolicy(
    name="engine-grace-covers-longest-request",
    description="A real engine's drain covers the longest request the gateway allows, or its pool resumes streams.",
    validate=engine_grace_covers_longest_request_validator,
)
