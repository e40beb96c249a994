"""Queries: the PromQL the dashboards are made of, over the series the fleet's processes export.

Series and the labels they are selected by:

* engines (vLLM's ``vllm:*``) and agents (``llmfleet_agent_*``): ``llmfleet_io_pool``, the pod label the engine
  PodMonitor copies onto every sample it scrapes (`infra.observability.PROM_POOL_LABEL`);
* gateways (``llmfleet_gateway_*``): ``tenant``, ``model`` (the pool's served name), ``status``, ``pool``;
* the control plane (``llmfleet_pool_replicas``, ``llmfleet_autoscaler_target_replicas``): ``pool``.

Rates use Grafana's ``$__rate_interval`` (at least four scrape intervals), so a panel never shows the gaps a
too-short window leaves.
"""

from __future__ import annotations

from infra.observability import PROM_POOL_LABEL

__all__ = [
    "PROM_POOL_LABEL",
    "REQUESTS",
    "TARGET_REPLICAS",
    "availability",
    "error_budget_remaining",
    "quantile",
    "rate",
]

REQUESTS = "llmfleet_gateway_requests_total"
TARGET_REPLICAS = "llmfleet_autoscaler_target_replicas"
RATE_WINDOW = "$__rate_interval"


def rate(metric: str, selector: str = "", by: str = "", window: str = RATE_WINDOW) -> str:
    """``sum [by (...)] (rate(metric{selector}[window]))``."""
    grouping = f" by ({by})" if by else ""
    series = f"{metric}{{{selector}}}" if selector else metric
    return f"sum{grouping} (rate({series}[{window}]))"


def quantile(q: float, histogram: str, selector: str = "", by: str = "") -> str:
    """The ``q`` quantile of a Prometheus histogram (``<histogram>_bucket``) over the rate window."""
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q:g}, {rate(histogram + '_bucket', selector, labels)})"


def _errors_over_requests(selector: str, window: str) -> str:
    errors = rate(REQUESTS, f'{selector},status=~"5.."', window=window)
    # No 5xx at all leaves the error series empty: `or vector(0)` keeps the ratio (and the panel) at zero.
    return f"(({errors}) or vector(0)) / {rate(REQUESTS, selector, window=window)}"


def availability(model: str) -> str:
    """Share of a model's requests that did not fail with a 5xx (4xx, quota refusals included, are answers)."""
    ratio = _errors_over_requests(f'model="{model}"', RATE_WINDOW)
    return f"1 - ({ratio})"


def error_budget_remaining(model: str, target: float, window: str) -> str:
    """``1 - (errors / requests over window) / (1 - target)``: 1 with no error, 0 with the budget spent,
    negative past it. From the raw counter, so it needs no recording rule."""
    selector = f'model="{model}"'
    errors = f'sum(increase({REQUESTS}{{{selector},status=~"5.."}}[{window}]))'
    requests = f"sum(increase({REQUESTS}{{{selector}}}[{window}]))"
    return f"1 - (({errors}) or vector(0)) / {requests} / (1 - {target:g})"
