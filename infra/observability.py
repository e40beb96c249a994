"""Observability: PrometheusRule objects for each pool's SLOs, alerting before the SLO is breached.

The seed's SLOs (availability 99.9%, P99 TTFT 300 ms, P99 decode 30 tok/s, errors < 0.5%) become, per pool:

* availability warning at half the allowed unavailability (99.95% for a 99.9% target), over 1 h;
* error-budget burn, multi-window: 14.4x over 1 h and 5 m pages (2% of a 30-day budget in an hour),
  6x over 6 h and 30 m opens a ticket (5% in six hours);
* TTFT P99 warning at 80% of the target, critical above it (vLLM's histogram);
* decode speed: P99 time per output token above 1 / (target tok/s), warning at 80% of that;
* error rate above half the target (warning) and above it (critical); any preemption (KV pressure).

Availability and errors come from the gateway's ``llmfleet_gateway_requests_total{model, status}`` counter;
latency from the engines' ``vllm:*`` histograms. Two PodMonitors make Prometheus scrape them: engine pods on
their ``engine`` (vLLM) and ``agent`` ports, with the pod's ``llmfleet.io/pool`` label copied to
``llmfleet_io_pool`` (what the rules select on), and gateway pods on ``http``.

Rules and monitors need the Prometheus Operator's CRDs: they wait for `infra.prometheus_crds.PrometheusCrds`
(``after``), or, with ``observability.installOperatorCrds: false``, say that the cluster's own operator has them
(``llmfleet.io/prometheus-operator: existing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from fleet import contract
from fleet.spec import FleetSpec, PoolSpec

__all__ = ["SloRules", "SloRulesArgs", "pod_monitor_spec", "slo_rule_groups", "warn_availability"]

REQUESTS = "llmfleet_gateway_requests_total"
# The pods' llmfleet.io/pool label as a PodMonitor's relabelling names it.
PROM_POOL_LABEL = "llmfleet_io_pool"


def warn_availability(target: float) -> float:
    """The availability that warns before the SLO: half the allowed unavailability (0.999 -> 0.9995)."""
    return 1.0 - (1.0 - target) / 2.0


def _error_ratio(model: str, window: str) -> str:
    sel = f'model="{model}"'
    return (
        f'(sum(rate({REQUESTS}{{{sel},status=~"5.."}}[{window}])) or vector(0))'
        f" / sum(rate({REQUESTS}{{{sel}}}[{window}]))"
    )


def _quantile(metric: str, pool: PoolSpec) -> str:
    sel = f'{PROM_POOL_LABEL}="{pool.name}"'
    return f"histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{sel}}}[5m])))"


def _alert(name: str, expr: str, severity: str, pool: PoolSpec, summary: str, for_: str = "5m") -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, "pool": pool.name},
        "annotations": {"summary": summary},
    }


def slo_rule_groups(pool: PoolSpec) -> list[dict[str, Any]]:
    """The Prometheus rule groups of one pool (PrometheusRule ``spec.groups``)."""
    slo = pool.slo
    model = pool.served_name
    budget = 1.0 - slo.availability
    ttft_s = slo.ttft_p99_ms / 1000.0
    tpot_s = 1.0 / slo.decode_tokens_per_s_p99
    warn = warn_availability(slo.availability)
    rules = [
        _alert(
            "LlmfleetAvailabilityBelowWarning",
            f"1 - ({_error_ratio(model, '1h')}) < {warn:g}",
            "warning",
            pool,
            f"{pool.name}: availability over 1h below {warn:.4%} (SLO {slo.availability:.3%})",
        ),
        _alert(
            "LlmfleetErrorBudgetBurnFast",
            f"({_error_ratio(model, '1h')}) > {14.4 * budget:g} and ({_error_ratio(model, '5m')}) > {14.4 * budget:g}",
            "critical",
            pool,
            f"{pool.name}: burning the error budget 14.4x (2% of the month's budget per hour)",
            for_="2m",
        ),
        _alert(
            "LlmfleetErrorBudgetBurnSlow",
            f"({_error_ratio(model, '6h')}) > {6 * budget:g} and ({_error_ratio(model, '30m')}) > {6 * budget:g}",
            "warning",
            pool,
            f"{pool.name}: burning the error budget 6x (5% of the month's budget in 6h)",
            for_="15m",
        ),
        _alert(
            "LlmfleetTtftP99NearSlo",
            f"{_quantile('vllm:time_to_first_token_seconds', pool)} > {0.8 * ttft_s:g}",
            "warning",
            pool,
            f"{pool.name}: P99 TTFT above 80% of {slo.ttft_p99_ms:g} ms",
            for_="10m",
        ),
        _alert(
            "LlmfleetTtftP99AboveSlo",
            f"{_quantile('vllm:time_to_first_token_seconds', pool)} > {ttft_s:g}",
            "critical",
            pool,
            f"{pool.name}: P99 TTFT above the {slo.ttft_p99_ms:g} ms SLO",
        ),
        _alert(
            "LlmfleetDecodeSpeedNearSlo",
            f"{_quantile('vllm:time_per_output_token_seconds', pool)} > {0.8 * tpot_s:g}",
            "warning",
            pool,
            f"{pool.name}: P99 decode close to the {slo.decode_tokens_per_s_p99:g} tok/s floor",
            for_="10m",
        ),
        _alert(
            "LlmfleetDecodeSpeedBelowSlo",
            f"{_quantile('vllm:time_per_output_token_seconds', pool)} > {tpot_s:g}",
            "critical",
            pool,
            f"{pool.name}: P99 decode slower than {slo.decode_tokens_per_s_p99:g} tok/s",
        ),
        _alert(
            "LlmfleetErrorRateNearSlo",
            f"({_error_ratio(model, '15m')}) > {slo.error_rate / 2:g}",
            "warning",
            pool,
            f"{pool.name}: error rate above half the {slo.error_rate:.2%} target",
            for_="10m",
        ),
        _alert(
            "LlmfleetErrorRateAboveSlo",
            f"({_error_ratio(model, '15m')}) > {slo.error_rate:g}",
            "critical",
            pool,
            f"{pool.name}: error rate above the {slo.error_rate:.2%} target",
        ),
        _alert(
            "LlmfleetPreemptions",
            f'sum(rate(vllm:num_preemptions_total{{{PROM_POOL_LABEL}="{pool.name}"}}[15m])) > 0',
            "warning",
            pool,
            f"{pool.name}: engines preempt sequences (KV cache pressure or fragmentation)",
            for_="15m",
        ),
    ]
    return [{"name": f"llmfleet-{pool.name}-slo", "rules": rules}]


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
        for pool in spec.pools:
            k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={
                    "name": f"llmfleet-{pool.name}-slo",
                    "namespace": spec.cluster.namespace,
                    "labels": {contract.LABEL_ENVIRONMENT: spec.environment, contract.LABEL_POOL: pool.name},
                    "annotations": operator,
                },
                spec={"groups": slo_rule_groups(pool)},
                opts=child,
            )
        for component, ports in (
            (contract.COMPONENT_ENGINE, ("engine", "agent")),
            (contract.COMPONENT_GATEWAY, ("admin",)),
        ):
            k8s.apiextensions.CustomResource(
                f"{name}-monitor-{component}",
                api_version="monitoring.coreos.com/v1",
                kind="PodMonitor",
                metadata={
                    "name": f"llmfleet-{component}",
                    "namespace": spec.cluster.namespace,
                    "labels": {contract.LABEL_ENVIRONMENT: spec.environment},
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
