"""Metrics server: the resource metrics API (``metrics.k8s.io``) that the gateway's CPU HPA reads.

EKS ships without metrics-server, and without it a ``HorizontalPodAutoscaler`` on CPU reports
``<unknown>/70%`` and never scales. This component installs the kubernetes-sigs ``metrics-server`` chart in
``kube-system``: two replicas with a PodDisruptionBudget, so a node drain never leaves the HPA blind, on the
CPU nodes when the target is ``aws`` (GPU nodes are tainted for engines).

Stack switch: ``cluster.installMetricsServer: false`` on a cluster that already runs one (k3s, GKE and AKS
ship their own; a second install would fight over the ``v1beta1.metrics.k8s.io`` APIService).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

__all__ = [
    "METRICS_SERVER_CHART_VERSION",
    "METRICS_SERVER_REPO",
    "MetricsServer",
    "MetricsServerArgs",
    "metrics_server_values",
]

# kubernetes-sigs/metrics-server tag metrics-server-helm-chart-3.13.1 (metrics-server 0.8.1); its values.yaml still has
# replicas, podDisruptionBudget.enabled/minAvailable and nodeSelector.
METRICS_SERVER_CHART_VERSION = "3.13.1"
METRICS_SERVER_REPO = "https://kubernetes-sigs.github.io/metrics-server/"


@dataclass(frozen=True)
class MetricsServerArgs:
    node_selector: dict[str, str] = field(default_factory=dict)  # where its pods run (the CPU nodes on aws)


def metrics_server_values(args: MetricsServerArgs) -> dict[str, Any]:
    """The chart values: two replicas, at most one down at a time, on the given nodes."""
    values: dict[str, Any] = {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}}
    if args.node_selector:
        values["nodeSelector"] = dict(args.node_selector)
    return values


class MetricsServer(pulumi.ComponentResource):
    """The ``metrics-server`` Helm release in ``kube-system``."""

    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: MetricsServerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:MetricsServer", name, None, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            k8s.helm.v3.ReleaseArgs(
                name="metrics-server",
                chart="metrics-server",
                version=METRICS_SERVER_CHART_VERSION,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=METRICS_SERVER_REPO),
                namespace="kube-system",
                values=metrics_server_values(args),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"release": self.release.name})
