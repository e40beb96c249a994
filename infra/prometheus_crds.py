"""Prometheus CRDs: the Prometheus Operator's CustomResourceDefinitions, installed before any rule or monitor.

`infra.observability.SloRules` creates PrometheusRule and PodMonitor objects. On a cluster without the
operator's CRDs the API server rejects them ("no matches for kind") and a first ``pulumi up`` stops half-way.
This component installs the prometheus-community ``prometheus-operator-crds`` chart: the CRDs alone, no
operator, no Prometheus. Whatever scrapes and evaluates them (kube-prometheus-stack, Amazon Managed
Prometheus' collector, Grafana Alloy) is the cluster owner's choice; kube-prometheus-stack would make that
choice for them and clash with a stack they already run. The chart ships the CRDs as templates, not in Helm's
``crds/`` folder, so a chart upgrade also upgrades the CRDs.

Deleting the release would delete every PrometheusRule and PodMonitor in the cluster, other teams' included,
so ``pulumi destroy`` leaves it in place (``retain_on_delete``).

Stack switch: ``observability.installOperatorCrds: false`` skips the install on a cluster that already has
the operator; the rules then say so in their ``llmfleet.io/prometheus-operator`` annotation.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

__all__ = ["CRDS_CHART", "CRDS_CHART_VERSION", "CRDS_REPO", "PrometheusCrds"]

CRDS_CHART = "prometheus-operator-crds"
# prometheus-community/helm-charts@cf408a29 charts/prometheus-operator-crds/Chart.yaml: 31.0.1 (operator v0.93.1).
CRDS_CHART_VERSION = "31.0.1"
CRDS_REPO = "https://prometheus-community.github.io/helm-charts"


class PrometheusCrds(pulumi.ComponentResource):
    """The ``prometheus-operator-crds`` Helm release (release metadata in ``kube-system``)."""

    release: k8s.helm.v3.Release

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:PrometheusCrds", name, None, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            k8s.helm.v3.ReleaseArgs(
                name=CRDS_CHART,
                chart=CRDS_CHART,
                version=CRDS_CHART_VERSION,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CRDS_REPO),
                namespace="kube-system",
            ),
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        self.register_outputs({"release": self.release.name})
