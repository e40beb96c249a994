"""First-up rules: what a first ``pulumi up`` on an empty cluster needs to exist before each object is created.

Mocks create everything at once and in any order; a cluster does not. Each rule checks an ordering the API
server or Pulumi's await enforces, on the graph the program registers:

* ``namespaces-created-first``: an object's namespace is a system one, or a Namespace the stack creates and the
  object waits for, or one the object says the cluster has (``llmfleet.io/namespace: existing``). Else: the API
  server answers ``namespaces "<name>" not found``.
* ``services-wait-for-lb-controller``: while the AWS Load Balancer Controller's Service webhook fails closed
  (chart 1.14.0's default ``serviceMutatorWebhookConfig.failurePolicy: Fail``), every Service and every chart
  that makes one waits for the controller's release. Else: ``failed calling webhook "mservice.elbv2.k8s.aws" ...
  no endpoints available`` (kubernetes-sigs/aws-load-balancer-controller#4140).
* ``custom-resources-after-crds``: a custom resource waits for what defines its kind (a CustomResourceDefinition
  or a chart that ships it), unless it says the cluster has the CRDs. Else: ``no matches for kind``.
* ``slow-starts-awaited``: a Deployment whose first replica may take longer than Pulumi's and Kubernetes'
  default 600 s (`fleet.protocol.marks.ANN_FIRST_READY`) has a progress deadline at least that long and an await timeout
  (custom timeouts, or ``pulumi.com/timeoutSeconds``) longer than the deadline. Else: the first ``up`` fails
  while engines are still pulling their image.

"Waits for" follows a resource's dependencies and its parent (a child registers only after its parent, and a
component registers only after its own dependencies), transitively.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from fleet.protocol import contract
from fleet.protocol.marks import (
    ANN_FIRST_READY,
    ANN_NAMESPACE_EXISTING,
    ANN_PULUMI_TIMEOUT,
    DEFAULT_AWAIT_S,
    SYSTEM_NAMESPACES,
)
from policies.common import DEPLOYMENT, SERVICE, annotations_of, as_float, get_path, is_engine, mapping
from policies.prerequisites import HELM_CHART, HELM_RELEASE, LB_CONTROLLER_CHART

__all__ = [
    "CHARTS_WITHOUT_SERVICES",
    "CRD_CHARTS",
    "custom_resources_after_crds",
    "namespaces_created_first",
    "services_wait_for_lb_controller",
    "slow_starts_awaited",
    "waits_for",
]

NAMESPACE = "kubernetes:core/v1:Namespace"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
# Charts that ship the CRDs of an API group.
CRD_CHARTS: dict[str, frozenset[str]] = {
    "monitoring.coreos.com": frozenset({"prometheus-operator-crds", "kube-prometheus-stack"}),
    "elbv2.k8s.aws": frozenset({LB_CONTROLLER_CHART}),
}
# Charts the program installs that make no Service (prometheus-operator-crds renders CRDs only).
CHARTS_WITHOUT_SERVICES = frozenset({"prometheus-operator-crds", LB_CONTROLLER_CHART})
# API groups of Kubernetes itself (besides the unqualified ones: core, apps, batch, policy, autoscaling) and
# Pulumi's own kubernetes resource types (Helm, YAML, kustomize): not custom resources.
_PULUMI_GROUPS = frozenset({"helm.sh", "yaml", "kustomize"})


def waits_for(resource: PolicyResource) -> set[str]:
    """The URNs ``resource`` waits for before it is created: dependencies and parents, transitively."""
    seen: set[str] = set()
    todo: list[PolicyResource] = [resource]
    while todo:
        current = todo.pop()
        nexts = [*current.dependencies, *([current.parent] if current.parent is not None else [])]
        for other in nexts:
            if other.urn not in seen:
                seen.add(other.urn)
                todo.append(other)
    return seen


def _name(resource: PolicyResource) -> str:
    return str(get_path(resource.props, "metadata", "name") or resource.name)


def _kind(resource: PolicyResource) -> str:
    return resource.resource_type.rsplit(":", 1)[-1]


def _chart(resource: PolicyResource) -> str:
    return str(resource.props.get("chart") or "").rstrip("/").rsplit("/", 1)[-1]


def _is_chart(resource: PolicyResource) -> bool:
    return resource.resource_type in (HELM_RELEASE, HELM_CHART)


def _namespace_of(resource: PolicyResource) -> str | None:
    """The namespace ``resource`` is created in, if it is a namespaced Kubernetes object (or a chart's release)."""
    if not resource.resource_type.startswith("kubernetes:") or resource.resource_type == NAMESPACE:
        return None
    if _is_chart(resource):
        return None if resource.props.get("createNamespace") else str(resource.props.get("namespace") or "default")
    namespace = get_path(resource.props, "metadata", "namespace")
    return None if namespace is None else str(namespace)


def namespaces_created_first_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    created = {
        str(get_path(r.props, "metadata", "name")): r.urn for r in args.resources if r.resource_type == NAMESPACE
    }
    for resource in args.resources:
        namespace = _namespace_of(resource)
        if namespace is None or namespace in SYSTEM_NAMESPACES:
            continue
        if annotations_of(resource.props).get(ANN_NAMESPACE_EXISTING) == "existing":
            continue
        what = f"{_kind(resource)} {_name(resource)!r}"
        if namespace not in created:
            report_violation(
                f"{what} goes into namespace {namespace!r}, which the stack does not create and the object does not "
                f"say the cluster has ({ANN_NAMESPACE_EXISTING}: existing). Risk: on a fresh cluster the API server "
                f'answers namespaces "{namespace}" not found and the first `pulumi up` stops half-way.',
                resource.urn,
            )
        elif created[namespace] not in waits_for(resource):
            report_violation(
                f"{what} goes into namespace {namespace!r}, which the stack creates, but does not wait for it. Risk: "
                "the two are created at once and the object can reach the API server first (namespace not found).",
                resource.urn,
            )


def _webhook_fails_closed(release: PolicyResource) -> bool:
    values = mapping(release.props.get("values"))
    if values.get("enableServiceMutatorWebhook") is False:
        return False
    return bool(get_path(values, "serviceMutatorWebhookConfig", "failurePolicy") != "Ignore")


def services_wait_for_lb_controller_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    controllers = [r for r in args.resources if _is_chart(r) and _chart(r) == LB_CONTROLLER_CHART]
    closed = {r.urn for r in controllers if _webhook_fails_closed(r)}
    if not closed:
        return
    for resource in args.resources:
        if resource.resource_type == SERVICE:
            what = f"Service {_name(resource)!r}"
        elif _is_chart(resource) and _chart(resource) not in CHARTS_WITHOUT_SERVICES:
            what = f"chart {_chart(resource)!r} (it makes Services)"
        else:
            continue
        if not closed & waits_for(resource):
            report_violation(
                f"{what} is created without waiting for the AWS Load Balancer Controller, whose Service webhook "
                "fails closed (serviceMutatorWebhookConfig.failurePolicy is not Ignore). Risk: while the controller "
                'has no endpoints the API server refuses the Service (failed calling webhook "mservice.elbv2.k8s.aws"'
                ": no endpoints available) and the first `pulumi up` fails.",
                resource.urn,
            )


def _api_group(resource_type: str) -> str | None:
    """The API group of a Kubernetes custom resource type token, None for Kubernetes' own and Pulumi's types."""
    if not resource_type.startswith("kubernetes:"):
        return None
    group = resource_type.split(":", 2)[1].split("/", 1)[0]
    if "." not in group or group.endswith(".k8s.io") or group in _PULUMI_GROUPS:
        return None
    return group


def _crd_providers(resources: Iterable[PolicyResource]) -> dict[tuple[str, str], set[str]]:
    """(group, kind) -> URNs of what defines it; kind "*" for a chart shipping a group's CRDs."""
    providers: dict[tuple[str, str], set[str]] = {}
    for resource in resources:
        if resource.resource_type == CRD:
            group = str(get_path(resource.props, "spec", "group") or "")
            kind = str(get_path(resource.props, "spec", "names", "kind") or "")
            providers.setdefault((group, kind), set()).add(resource.urn)
        elif _is_chart(resource):
            for group, charts in CRD_CHARTS.items():
                if _chart(resource) in charts:
                    providers.setdefault((group, "*"), set()).add(resource.urn)
    return providers


def _declares_existing_crds(resource: PolicyResource, group: str) -> bool:
    operator = annotations_of(resource.props).get(contract.ANN_PROMETHEUS_OPERATOR)
    return group == "monitoring.coreos.com" and operator == "existing"


def custom_resources_after_crds_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    providers = _crd_providers(args.resources)
    for resource in args.resources:
        group = _api_group(resource.resource_type)
        if group is None or _declares_existing_crds(resource, group):
            continue
        kind = _kind(resource)
        defining = providers.get((group, kind), set()) | providers.get((group, "*"), set())
        what = f"{kind} {_name(resource)!r} ({group})"
        if not defining:
            report_violation(
                f"{what} is a custom resource whose CRD nothing in the stack defines, and it does not say the "
                "cluster has it. Risk: the API server rejects it (no matches for kind) and `pulumi up` stops.",
                resource.urn,
            )
        elif not defining & waits_for(resource):
            report_violation(
                f"{what} does not wait for what defines its CRD. Risk: on a fresh cluster it reaches the API server "
                "before the CRD is established (no matches for kind) and the first `pulumi up` fails.",
                resource.urn,
            )


def _await_timeout_s(args: ResourceValidationArgs) -> float:
    """The seconds Pulumi awaits the resource's create: its custom timeout, else its annotation, else 600."""
    custom = float(getattr(getattr(args.opts, "custom_timeouts", None), "create_seconds", 0) or 0)
    if custom > 0:
        return custom
    return as_float(annotations_of(args.props).get(ANN_PULUMI_TIMEOUT), float(DEFAULT_AWAIT_S)) or 0.0


def _slow_start_problems(args: ResourceValidationArgs) -> Iterator[str]:
    annotations: Mapping[str, Any] = annotations_of(args.props)
    first_ready = as_float(annotations.get(ANN_FIRST_READY))
    if first_ready is None:
        if is_engine(args.resource_type, args.props) and annotations.get(contract.ANN_ENGINE_KIND) != "sim":
            yield (
                f"engine Deployment lacks the {ANN_FIRST_READY} annotation, so its await cannot be checked against "
                "its first start (an image pull plus the pool's cold start)"
            )
        return
    if first_ready <= DEFAULT_AWAIT_S:
        return
    deadline = as_float(get_path(args.props, "spec", "progressDeadlineSeconds"), float(DEFAULT_AWAIT_S)) or 0.0
    if deadline < first_ready:
        yield f"progressDeadlineSeconds {deadline:g} < its first start's {first_ready:g} s"
    timeout = _await_timeout_s(args)
    if timeout <= max(deadline, first_ready):
        yield (
            f"Pulumi awaits it {timeout:g} s (custom timeouts or {ANN_PULUMI_TIMEOUT}), no longer than its progress "
            f"deadline ({deadline:g} s) and first start ({first_ready:g} s)"
        )


def slow_starts_awaited_validator(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != DEPLOYMENT:
        return
    for problem in _slow_start_problems(args):
        report_violation(
            f"{problem}. Risk: the first `pulumi up` is marked failed (or Kubernetes marks the rollout stalled) "
            "while replicas are still pulling the engine image and loading weights, and the next `up` retries "
            "from a half-made stack.",
            None,
        )


namespaces_created_first = StackValidationPolicy(
    name="namespaces-created-first",
    description="Every namespaced object goes into a system namespace or one the stack creates first.",
    validate=namespaces_created_first_validator,
)

services_wait_for_lb_controller = StackValidationPolicy(
    name="services-wait-for-lb-controller",
    description=(
        "While the AWS Load Balancer Controller's Service webhook fails closed, every Service and every chart "
        "that makes one waits for the controller."
    ),
    validate=services_wait_for_lb_controller_validator,
)

custom_resources_after_crds = StackValidationPolicy(
    name="custom-resources-after-crds",
    description="Every custom resource waits for the CRD (or the chart) that defines its kind.",
    validate=custom_resources_after_crds_validator,
)

slow_starts_awaited = ResourceValidationPolicy(
    name="slow-starts-awaited",
    description=(
        "A Deployment whose first start may exceed the default 600 s await has a progress deadline covering it "
        "and a longer Pulumi await."
    ),
    validate=slow_starts_awaited_validator,
)
