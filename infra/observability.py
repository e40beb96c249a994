"""Observability: a PrometheusRule per pool with its SLO recording rules and alerts, and the PodMonitors they need.

The rules are `fleet.slo.rules.pool_rule_groups` (the SLIs, their windows and the burn-rate alerts are described
there and in docs/operations.md "SLO alerts"); this module only wraps them in Kubernetes objects. Two PodMonitors
make Prometheus scrape what the rules read: engine pods on their ``engine`` (vLLM) and ``agent`` ports, with the
pod's ``llmfleet.io/pool`` label copied to ``llmfleet_io_pool`` (what the engine rules select on), and gateway
pods on ``admin``.

Nothing here evaluates or scrapes them: a Prometheus Operator's Prometheus must select them, and each carries
``observability.prometheusSelectorLabels`` for that (kube-prometheus-stack's default selectors match only its
own ``release`` label; docs/cloud.md "SLO alerts need a Prometheus"). Rules and monitors need the Prometheus
Operator's CRDs: they wait for `infra.prometheus_crds.PrometheusCrds`
(``after``), or, with ``observability.installOperatorCrds: false``, say that the cluster's own operator has them
(``llmfleet.io/prometheus-operator: existing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet.protocol import contract
from fleet.slo.rules import PROM_POOL_LABEL, pool_rule_groups, warn_availability
from fleet.spec.stack import FleetSpec

__all__ = ["PROM_POOL_LABEL", "SloRules", "SloRulesArgs", "pod_monitor_spec", "warn_availability"]


@dataclass(frozen=True)
class SloRulesArgs:
    spec: FleetSpec
    after: Sequence[pulumi.Resource] = field(default_factory=list)  # the CRDs' release, the namespace


class SloRules(pulumi.ComponentResource):
    """One ``monitoring.coreos.com/v1`` PrometheusRule per pool (needs the Prometheus Operator's CRDs)."""

    def __init__(self, name: str, args: SloRulesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:k8s:SloRules", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self, depends_on=list(args.after))
        operator = {
            contract.ANN_PROMETHEUS_OPERATOR: "installed" if spec.observability.install_operator_crds else "existing"
        }
        # What the cluster's Prometheus selects rules and monitors by (kube-prometheus-stack: its release label).
        selected = dict(spec.observability.prometheus_selector_labels)
        for pool in spec.pools:
            k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={
                    "name": f"llmfleet-{pool.name}-slo",
                    "namespace": spec.cluster.namespace,
                    "labels": {
                        **selected,
                        contract.LABEL_ENVIRONMENT: spec.environment,
                        contract.LABEL_POOL: pool.name,
                    },
                    "annotations": operator,
                },
                spec={"groups": pool_rule_groups(pool)},
                opts=child,
            )
        for component, ports in (
            (contract.COMPONENT_ENGINE, ("engine", "agent")),
            (contract.COMPONENT_GATEWAY, ("admin",)),
            (contract.COMPONENT_CONTROL_PLANE, ("http",)),
        ):
            k8s.apiextensions.CustomResource(
                f"{name}-monitor-{component}",
                api_version="monitoring.coreos.com/v1",
                kind="PodMonitor",
                metadata={
                    "name": f"llmfleet-{component}",
                    "namespace": spec.cluster.namespace,
                    "labels": {**selected, contract.LABEL_ENVIRONMENT: spec.environment},
                    "annotations": operator,
                },
                spec=pod_monitor_spec(component, ports),
                opts=child,
            )
        self.register_outputs({})


def pod_monitor_spec(component: str, ports: tuple[str, ...]) -> dict[str, Any]:
    """Scrape ``ports`` of the pods of ``component`` every 15 s, keeping the pool label for the SLO rules."""
    relabel = {
        "sourceLabels": ["__meta_kubernetes_pod_label_llmfleet_io_pool"],
        "targetLabel": PROM_POOL_LABEL,
    }
    return {
        "selector": {"matchLabels": {contract.LABEL_COMPONENT: component}},
        "podMetricsEndpoints": [
            {"port": port, "path": "/metrics", "interval": "15s", "relabelings": [relabel]} for port in ports
        ],
    }
