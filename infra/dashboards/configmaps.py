"""Dashboard ConfigMaps: the fleet's Grafana dashboards where Grafana's dashboard sidecar picks them up.

One ConfigMap per dashboard (`infra.dashboards.DASHBOARDS`), ``llmfleet-<environment>-<name>``, in the
Prometheus namespace (``observability.prometheusNamespace``: where kube-prometheus-stack runs its Grafana,
and the only namespace its sidecar searches by default). The sidecar loads every ConfigMap labelled
`SIDECAR_LABEL` (kube-prometheus-stack's ``grafana.sidecar.dashboards.label``, any value) and files it under
the folder `FOLDER_ANNOTATION` names (k8s-sidecar's default folder annotation; Grafana shows it as a folder when
the chart sets ``grafana.sidecar.dashboards.provider.foldersFromFilesStructure: true``). The dashboards'
``datasource`` variable picks the Prometheus, so no data source uid is baked in.

That namespace must exist before the ConfigMaps are created. On aws the cluster is the stack's own, so nothing
else can have made it: the program creates it (kept on ``pulumi destroy``, since a Prometheus installed later may
live there). On kubernetes the cluster is the operator's and runs its Prometheus already; creating an existing
namespace fails (pulumi-kubernetes 4.29 and later create, not upsert), so the ConfigMaps say the namespace is
the cluster's (``llmfleet.io/namespace: existing``) and docs/cloud.md asks for it. The fleet's own namespace and
the system ones are never created here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.protocol.marks import ANN_NAMESPACE_EXISTING, SYSTEM_NAMESPACES
from fleet.spec.stack import FleetSpec
from infra.dashboards import build_dashboards, dashboard_text

__all__ = [
    "FOLDER",
    "FOLDER_ANNOTATION",
    "SIDECAR_LABEL",
    "DashboardConfigMaps",
    "DashboardConfigMapsArgs",
    "creates_namespace",
]

SIDECAR_LABEL = "grafana_dashboard"
FOLDER_ANNOTATION = "k8s-sidecar-target-directory"
FOLDER = "llmfleet"


@dataclass(frozen=True)
class DashboardConfigMapsArgs:
    spec: FleetSpec
    after: Sequence[pulumi.Resource] = field(default_factory=list)  # the fleet's base (its namespace)


def creates_namespace(spec: FleetSpec) -> bool:
    """Whether the program creates the dashboards' namespace: on aws, unless it is the fleet's or a system one."""
    namespace = spec.observability.prometheus_namespace
    return spec.target == "aws" and namespace != spec.cluster.namespace and namespace not in SYSTEM_NAMESPACES


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
        namespace = spec.observability.prometheus_namespace
        after: list[pulumi.Resource] = list(args.after)
        annotations: dict[str, Any] = {FOLDER_ANNOTATION: FOLDER}
        if creates_namespace(spec):
            after.append(
                k8s.core.v1.Namespace(
                    f"{name}-namespace",
                    metadata={"name": namespace, "labels": {"app.kubernetes.io/part-of": "llmfleet"}},
                    opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
                )
            )
        elif namespace != spec.cluster.namespace and namespace not in SYSTEM_NAMESPACES:
            annotations[ANN_NAMESPACE_EXISTING] = "existing"
        for dashboard, model in build_dashboards(spec).items():
            k8s.core.v1.ConfigMap(
                f"{name}-{dashboard}",
                metadata={
                    "name": f"llmfleet-{spec.environment}-{dashboard}",
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": annotations,
                },
                # The sidecar writes each key as a file of one folder: the environment keeps two stacks apart.
                data={f"llmfleet-{spec.environment}-{dashboard}.json": dashboard_text(model)},
                opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            )
        self.register_outputs({})
