"""Prerequisite rules: what the fleet's objects need from the cluster is in the stack that creates them.

* A PrometheusRule or PodMonitor needs the Prometheus Operator's CRDs: a ``prometheus-operator-crds`` (or
  ``kube-prometheus-stack``) Helm release in the stack.
* A HorizontalPodAutoscaler needs the resource metrics API: a ``metrics-server`` Helm release or EKS add-on.
* On aws (an EKS cluster in the stack), a Service of ``aws-load-balancer-type: external`` (or ``nlb-ip``) needs
  the AWS Load Balancer Controller: an ``aws-load-balancer-controller`` Helm release.
* A gateway whose quotas live in Redis (``llmfleet.io/quota-backend: redis``) with the URL from the Secret the
  stack provisions (``llmfleet.io/redis-url-from: secret``) needs that Secret and a Redis: an ElastiCache
  replication group, or the in-cluster quota Redis (a Deployment labelled ``quota-redis``).

Opt-outs, for a cluster that already runs a prerequisite, come from the program's own marks: a rule or monitor
annotated ``llmfleet.io/prometheus-operator: existing`` (``observability.installOperatorCrds: false``), and, as
the HPA carries no mark, ``cluster.installMetricsServer: false`` in the stack file the stack deploys (its
``llmfleet-spec`` ConfigMap). The load balancer controller has no opt-out: on aws the program always installs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs, StackValidationPolicy

from fleet.protocol import contract
from fleet.spec.loader import NAMESPACE
from policies.common import DEPLOYMENT, SERVICE, annotations_of, get_path, labels, mapping

__all__ = ["cluster_prerequisites_installed", "helm_charts"]

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
HELM_CHART = "kubernetes:helm.sh/v4:Chart"
EKS_ADDON = "aws:eks/addon:Addon"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
SECRET = "kubernetes:core/v1:Secret"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
HPA_TYPES = frozenset(
    {"kubernetes:autoscaling/v2:HorizontalPodAutoscaler", "kubernetes:autoscaling/v1:HorizontalPodAutoscaler"}
)
MONITORING_TYPES = frozenset(
    {"kubernetes:monitoring.coreos.com/v1:PrometheusRule", "kubernetes:monitoring.coreos.com/v1:PodMonitor"}
)
REDIS_SERVER_TYPES = frozenset(
    {
        "aws:elasticache/replicationGroup:ReplicationGroup",
        "aws:elasticache/cluster:Cluster",
        "aws:elasticache/serverlessCache:ServerlessCache",
    }
)

# What provides each prerequisite: Helm charts (by chart name) and EKS add-ons (by add-on name).
CRD_CHARTS = frozenset({"prometheus-operator-crds", "kube-prometheus-stack"})
METRICS_SERVER = "metrics-server"
LB_CONTROLLER_CHART = "aws-load-balancer-controller"
_LB_TYPE = "service.beta.kubernetes.io/aws-load-balancer-type"
_CONTROLLER_LB_TYPES = frozenset({"external", "nlb-ip"})  # the in-tree provider ignores these


def helm_charts(resources: Iterable[PolicyResource]) -> set[str]:
    """The charts the stack installs, by name (``repo/chart`` and ``oci://.../chart`` reduced to ``chart``)."""
    charts: set[str] = set()
    for resource in resources:
        if resource.resource_type in (HELM_RELEASE, HELM_CHART):
            chart = str(resource.props.get("chart") or "")
            charts.add(chart.rstrip("/").rsplit("/", 1)[-1])
    return charts


def _eks_addons(resources: Iterable[PolicyResource]) -> set[str]:
    return {str(r.props.get("addonName")) for r in resources if r.resource_type == EKS_ADDON}


def _metrics_server_declared_existing(resources: Iterable[PolicyResource]) -> bool:
    """Whether the deployed stack file says the cluster has its own metrics-server."""
    for resource in resources:
        if resource.resource_type != CONFIG_MAP or get_path(resource.props, "metadata", "name") != (
            contract.SPEC_CONFIGMAP
        ):
            continue
        for text in mapping(resource.props.get("data")).values():
            try:
                document = yaml.safe_load(str(text))
            except yaml.YAMLError:
                continue
            cluster = get_path(document, "config", f"{NAMESPACE}:cluster")
            if mapping(cluster).get("installMetricsServer") is False:
                return True
    return False


def _object_name(resource: PolicyResource) -> str:
    return str(get_path(resource.props, "metadata", "name") or resource.name)


def _kind(resource: PolicyResource) -> str:
    return resource.resource_type.rsplit(":", 1)[-1]


def _check_operator_crds(resources: list[PolicyResource], charts: set[str], report: ReportViolation) -> None:
    if charts & CRD_CHARTS:
        return
    for resource in resources:
        if resource.resource_type not in MONITORING_TYPES:
            continue
        if annotations_of(resource.props).get(contract.ANN_PROMETHEUS_OPERATOR) == "existing":
            continue
        report(
            f"{_kind(resource)} {_object_name(resource)!r} needs the Prometheus Operator's CRDs "
            "(monitoring.coreos.com), but the stack installs no prometheus-operator-crds release and the object "
            f"does not say the cluster has them ({contract.ANN_PROMETHEUS_OPERATOR}: existing). Risk: the API "
            "server rejects it ('no matches for kind'), so `pulumi up` stops half-way and the fleet runs without "
            "its SLO alerts.",
            resource.urn,
        )


def _check_metrics_server(resources: list[PolicyResource], charts: set[str], report: ReportViolation) -> None:
    if METRICS_SERVER in charts or METRICS_SERVER in _eks_addons(resources):
        return
    if _metrics_server_declared_existing(resources):
        return
    for resource in resources:
        if resource.resource_type in HPA_TYPES:
            report(
                f"HorizontalPodAutoscaler {_object_name(resource)!r} needs the resource metrics API, but the stack "
                "installs no metrics-server and its stack file does not say the cluster has one "
                "(cluster.installMetricsServer: false). Risk: on a cluster without it (EKS ships none) the HPA "
                "reads <unknown> and never scales, so the gateway stays at its minimum replicas under load.",
                resource.urn,
            )


def _check_lb_controller(resources: list[PolicyResource], charts: set[str], report: ReportViolation) -> None:
    if LB_CONTROLLER_CHART in charts or not any(r.resource_type == EKS_CLUSTER for r in resources):
        return
    for resource in resources:
        if resource.resource_type != SERVICE:
            continue
        lb_type = str(annotations_of(resource.props).get(_LB_TYPE, ""))
        if lb_type in _CONTROLLER_LB_TYPES:
            report(
                f"Service {_object_name(resource)!r} asks for an NLB from the AWS Load Balancer Controller "
                f"({_LB_TYPE}: {lb_type}), but the stack installs no aws-load-balancer-controller release. Risk: "
                "nothing reconciles the Service, so it never gets a load balancer and clients cannot reach the "
                "fleet.",
                resource.urn,
            )


def _has_redis(resources: list[PolicyResource]) -> bool:
    for resource in resources:
        if resource.resource_type in REDIS_SERVER_TYPES:
            return True
        if resource.resource_type == DEPLOYMENT and (
            labels(resource.props).get(contract.LABEL_COMPONENT) == contract.COMPONENT_QUOTA_REDIS
        ):
            return True
    return False


def _secret_namespaces(resources: list[PolicyResource], name: str) -> set[str]:
    return {
        str(get_path(r.props, "metadata", "namespace") or "default")
        for r in resources
        if r.resource_type == SECRET and get_path(r.props, "metadata", "name") == name
    }


def _check_quota_redis(resources: list[PolicyResource], report: ReportViolation) -> None:
    server = _has_redis(resources)
    secrets = _secret_namespaces(resources, contract.QUOTA_REDIS_NAME)
    for resource in resources:
        if resource.resource_type != DEPLOYMENT:
            continue
        annotations: Mapping[str, Any] = annotations_of(resource.props)
        if annotations.get(contract.ANN_QUOTA_BACKEND) != "redis":
            continue
        if annotations.get(contract.ANN_REDIS_URL_FROM) != "secret":
            continue  # the URL comes from the stack: a Redis the stack does not own
        namespace = str(get_path(resource.props, "metadata", "namespace") or "default")
        missing = []
        if namespace not in secrets:
            missing.append(f"the Secret {contract.QUOTA_REDIS_NAME!r} in namespace {namespace!r}")
        if not server:
            missing.append("a Redis (an ElastiCache replication group or the in-cluster quota Redis)")
        if missing:
            report(
                f"Deployment {_object_name(resource)!r} counts tenant quotas in Redis and reads the URL from a Secret "
                f"the stack provisions, but the stack lacks {' and '.join(missing)}. Risk: its pods cannot start "
                "(the Secret is missing) or every quota check fails against a Redis that does not exist, so the "
                "gateway refuses the tenants' requests.",
                resource.urn,
            )


def cluster_prerequisites_installed_validator(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = list(args.resources)
    charts = helm_charts(resources)
    _check_operator_crds(resources, charts, report_violation)
    _check_metrics_server(resources, charts, report_violation)
    _check_lb_controller(resources, charts, report_violation)
    _check_quota_redis(resources, report_violation)


cluster_prerequisites_installed = StackValidationPolicy(
    name="cluster-prerequisites-installed",
    description=(
        "Objects needing cluster prerequisites come with them: Prometheus Operator CRDs for rules and monitors, "
        "metrics-server for HPAs, the AWS Load Balancer Controller for external NLB Services, the quota Redis "
        "for a gateway reading its URL from the stack's Secret."
    ),
    validate=cluster_prerequisites_installed_validator,
)
