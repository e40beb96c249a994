"""Dashboard ConfigMaps: the fleet's Grafana dashboards where Grafana's dashboard sidecar picks them up.

One ConfigMap per dashboard (`infra.dashboards.DASHBOARDS`), ``llmfleet-<environment>-<name>``, in the
Prometheus namespace (``observability.prometheusNamespace``: where kube-prometheus-stack runs its Grafana,
and the only namespace its sidecar searches by default). The sidecar loads every ConfigMap labelled
`SIDECAR_LABEL` (kube-prometheus-stack's ``grafana.sidecar.dashboards.label``, any value) and files it under
the folder `FOLDER_ANNOTATION` names (k8s-sidecar's default folder annotation; Grafana shows it as a folder when
the chart sets ``grafana.sidecar.dashboards.provider.foldersFromFilesStructure: true``). The dashboards'
``datasource`` variable picks the Prometheus, so no data source uid is baked in.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from fleet import contract
from fleet.spec import FleetSpec
from infra.dashboards import build_dashboards, dashboard_text

__all__ = ["FOLDER", "FOLDER_ANNOTATION", "SIDECAR_LABEL", "DashboardConfigMaps", "DashboardConfigMapsArgs"]

SIDECAR_LABEL = "grafana_dashboard"
FOLDER_ANNOTATION = "k8s-sidecar-target-directory"
FOLDER = "llmfleet"


@dataclass(frozen=True)
class DashboardConfigMapsArgs:
    spec: FleetSpec


class DashboardConfigMaps(pulumi.ComponentResource):
    """A ConfigMap ``{llmfleet-<environment>-<name>.json: <dashboard JSON>}`` per dashboard, labelled for
    Grafana's sidecar."""

    def __init__(self, name: str, args: DashboardConfigMapsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:DashboardConfigMaps", name, None, opts)
        spec = args.spec
        labels = {
            SIDECAR_LABEL: "1",
            contract.LABEL_ENVIRONMENT: spec.environment,
            "app.kubernetes.io/part-of": "llmfleet",
        }
        for dashboard, model in build_dashboards(spec).items():
            k8s.core.v1.ConfigMap(
                f"{name}-{dashboard}",
                metadata={
                    "name": f"llmfleet-{spec.environment}-{dashboard}",
                    "namespace": spec.observability.prometheus_namespace,
                    "labels": labels,
                    "annotations": {FOLDER_ANNOTATION: FOLDER},
                },
                # The sidecar writes each key as a file of one folder: the environment keeps two stacks apart.
                data={f"llmfleet-{spec.environment}-{dashboard}.json": dashboard_text(model)},
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})
