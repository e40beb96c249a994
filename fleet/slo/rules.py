"""SLO rules: each pool's SLIs as Prometheus recording rules, and multi-window burn-rate alerts on them.

A pool's `SloSpec` becomes three SLIs, each the share of *bad* events in a window, recorded per pool at the
windows the alerts read (5m, 30m, 1h, 6h):

* availability, ``llmfleet:pool_request_errors:ratio_rate<w>``: 5xx answers over all answers, from the gateway's
  ``llmfleet_gateway_requests_total{model,status}``. Budget: ``1 - availability`` (0.1% for 99.9%).
* TTFT, ``llmfleet:pool_ttft_slow_requests:ratio_rate<w>``: requests whose first token came later than
  ``ttftP99Ms``, from the gateway's ``llmfleet_gateway_ttft_seconds`` histogram (what clients see, queueing
  included). The gateway adds each pool's threshold to that histogram's edges (`ttft_slo_edges`), so the
  ``le`` bucket the rule reads is the threshold itself and the ratio is exact. Budget: 1% (a P99 target).
* decode speed, ``llmfleet:pool_slow_output_tokens:ratio_rate<w>``: output tokens whose inter-token latency
  exceeded ``1 / decodeTokensPerSP99``, from vLLM's ``vllm:inter_token_latency_seconds``. vLLM's edges are
  fixed (`VLLM_ITL_BUCKETS`), so the rule counts tokens slower than the edge at or below the threshold (25 ms
  for 30 tok/s, i.e. 33.3 ms): the SLI can only overstate slowness, so an alert may come early, never late.
  Budget: 1%.

Alerts, per SLI (Google SRE workbook, multiwindow multi-burn-rate), all labelled ``severity`` and ``pool``:

* ``<Sli>BudgetBurnFast`` (critical): bad share above 14.4x the budget over 1h and over 5m (2% of a 30-day budget
  in one hour); the 5m window makes it stop within minutes of the burn stopping.
* ``<Sli>BudgetBurnSlow`` (critical): above 6x over 6h and over 30m (5% of the budget in six hours).
* ``<Sli>NearSlo`` (warning): above half the budget over 1h, the warning before the SLO is breached (for
  availability: below 99.95% for a 99.9% target, `warn_availability`).

Plus ``LlmfleetErrorRateAboveSlo`` (critical: 5xx share over 30m above ``errorRate``) and ``LlmfleetPreemptions``
(warning: engines preempting sequences for 15 minutes, KV-cache pressure). A pool whose engines publish KV-cache
events (``engine.kvEvents``) adds two warnings for 10 minutes, read from the gateways that route it by
``kv-cache`` (none fires where no gateway does): ``LlmfleetKvEventStreamsDown`` (a gateway has lost replicas'
event streams: it routes them by load alone) and ``LlmfleetKvTokenizerMissing`` (a gateway has no tokenizer for
the pool: kv-cache scores nothing for it).

Gateway series are selected by ``model`` (the pool's served name, the only model label the gateway writes);
engine series by ``llmfleet_io_pool`` (`PROM_POOL_LABEL`), the pod label ``llmfleet.io/pool`` as the scrape
configuration copies it. Pure: a spec in, plain rule dictionaries out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = [
    "ENGINE_ITL",
    "GATEWAY_TTFT",
    "KV_STREAMS",
    "KV_TOKENIZER",
    "PREEMPTIONS",
    "PROM_POOL_LABEL",
    "REQUESTS",
    "VLLM_ITL_BUCKETS",
    "WINDOWS",
    "Sli",
    "edge_at_or_below",
    "le_label",
    "pool_rule_groups",
    "pool_slis",
    "rule_groups",
    "rules_yaml",
    "ttft_slo_edges",
    "warn_availability",
]

REQUESTS = "llmfleet_gateway_requests_total"
GATEWAY_TTFT = "llmfleet_gateway_ttft_seconds"
ENGINE_ITL = "vllm:inter_token_latency_seconds"
PREEMPTIONS = "vllm:num_preemptions_total"
KV_STREAMS = "llmfleet_gateway_kv_event_streams"
KV_TOKENIZER = "llmfleet_gateway_prompt_tokens_available"
# The pods' llmfleet.io/pool label as a PodMonitor's relabelling names it.
PROM_POOL_LABEL = "llmfleet_io_pool"
# vLLM 0.33's inter-token latency edges (vllm/v1/metrics/loggers.py); engine_sim exports the same.
VLLM_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
WINDOWS = ("5m", "30m", "1h", "6h")

# (name suffix, long window, short window, burn factor, for, severity)
_BURNS = (
    ("BudgetBurnFast", "1h", "5m", 14.4, "2m", "critical"),
    ("BudgetBurnSlow", "6h", "30m", 6.0, "15m", "critical"),
)
_WARN_WINDOW, _WARN_FOR = "1h", "10m"
_ERROR_RATE_WINDOW = "30m"


def warn_availability(target: float) -> float:
    """The availability that warns before the SLO: half the allowed unavailability (0.999 -> 0.9995)."""
    return 1.0 - (1.0 - target) / 2.0


def ttft_slo_edges(spec: FleetSpec) -> tuple[float, ...]:
    """Each pool's TTFT threshold in seconds: edges the gateway's TTFT histogram must have for exact SLIs."""
    return tuple(sorted({pool.slo.ttft_p99_ms / 1000.0 for pool in spec.pools}))


def edge_at_or_below(edges: Iterable[float], threshold: float) -> float:
    """The largest edge not above ``threshold``; ValueError when every edge is above it (nothing to count)."""
    below = [edge for edge in edges if edge <= threshold * (1 + 1e-9)]  # 1/40 == 0.025 must count as equal
    if not below:
        raise ValueError(f"no histogram edge at or below {threshold:g} s (smallest: {min(edges):g} s)")
    return max(below)


def le_label(edge: float) -> str:
    """``edge`` as Python's prometheus_client writes it in ``le`` (``0.3``, ``1.0``), which gateway and vLLM use."""
    return repr(float(edge))


@dataclass(frozen=True)
class Sli:
    """One SLI of a pool: PromQL of its bad share over a window, and the share its SLO allows."""

    alert: str  # alert name prefix, e.g. LlmfleetAvailability
    record: str  # recording rule name with ``{window}`` in it
    budget: float  # the bad share the SLO allows
    bad_share: Callable[[str], str]  # window -> PromQL
    what: str  # the bad events, for summaries

    def recorded(self, window: str) -> str:
        return self.record.format(window=window)


def _rate(metric: str, matchers: str, window: str) -> str:
    return f"sum(rate({metric}{{{matchers}}}[{window}]))"


def pool_slis(pool: PoolSpec) -> list[Sli]:
    """Availability, TTFT and decode speed of ``pool``, in that order."""
    slo = pool.slo
    model = f'model="{pool.served_name}"'
    engines = f'{PROM_POOL_LABEL}="{pool.name}"'
    ttft_le = le_label(slo.ttft_p99_ms / 1000.0)  # an edge of the gateway's histogram (ttft_slo_edges)
    itl_edge = edge_at_or_below(VLLM_ITL_BUCKETS, 1.0 / slo.decode_tokens_per_s_p99)
    itl_le = le_label(itl_edge)

    def errors(w: str) -> str:
        # No 5xx series yet means none happened: 0, not an empty result that hides the denominator.
        failed = _rate(REQUESTS, model + ',status=~"5.."', w)
        return f"({failed} or vector(0)) / {_rate(REQUESTS, model, w)}"

    def slow_first_tokens(w: str) -> str:
        fast = _rate(f"{GATEWAY_TTFT}_bucket", f'{model},le="{ttft_le}"', w)
        return f"1 - {fast} / {_rate(f'{GATEWAY_TTFT}_count', model, w)}"

    def slow_tokens(w: str) -> str:
        fast = _rate(f"{ENGINE_ITL}_bucket", f'{engines},le="{itl_le}"', w)
        return f"1 - {fast} / {_rate(f'{ENGINE_ITL}_count', engines, w)}"

    return [
        Sli(
            "LlmfleetAvailability",
            "llmfleet:pool_request_errors:ratio_rate{window}",
            1.0 - slo.availability,
            errors,
            "5xx answers",
        ),
        Sli(
            "LlmfleetTtft",
            "llmfleet:pool_ttft_slow_requests:ratio_rate{window}",
            0.01,
            slow_first_tokens,
            f"requests with a first token later than {slo.ttft_p99_ms:g} ms",
        ),
        Sli(
            "LlmfleetDecodeSpeed",
            "llmfleet:pool_slow_output_tokens:ratio_rate{window}",
            0.01,
            slow_tokens,
            f"output tokens slower than {itl_edge * 1000:g} ms (the ITL edge at or below "
            f"1/{slo.decode_tokens_per_s_p99:g} s)",
        ),
    ]


def _alert(name: str, expr: str, for_: str, severity: str, pool: PoolSpec, summary: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, "pool": pool.name},
        "annotations": {"summary": f"{pool.name}: {summary}"},
    }


def _sli_alerts(sli: Sli, pool: PoolSpec) -> list[dict[str, Any]]:
    def above(window: str, share: float) -> str:
        return f'{sli.recorded(window)}{{pool="{pool.name}"}} > {share:g}'

    alerts = [
        _alert(
            sli.alert + suffix,
            f"{above(long, factor * sli.budget)} and {above(short, factor * sli.budget)}",
            for_,
            severity,
            pool,
            f"{sli.what} at {factor:g}x the budget ({factor * sli.budget:.3%}) over {long} and {short}",
        )
        for suffix, long, short, factor, for_, severity in _BURNS
    ]
    alerts.append(
        _alert(
            sli.alert + "NearSlo",
            above(_WARN_WINDOW, sli.budget / 2),
            _WARN_FOR,
            "warning",
            pool,
            f"{sli.what} above half the budget ({sli.budget / 2:.3%}) over {_WARN_WINDOW}",
        )
    )
    return alerts


def pool_rule_groups(pool: PoolSpec) -> list[dict[str, Any]]:
    """``pool``'s rule groups (a PrometheusRule's ``spec.groups``): recording rules first, then alerts.

    One group, so each evaluation records the SLIs before the alerts read them.
    """
    slis = pool_slis(pool)
    records: list[dict[str, Any]] = [
        {"record": sli.recorded(w), "expr": sli.bad_share(w), "labels": {"pool": pool.name}}
        for sli in slis
        for w in WINDOWS
    ]
    alerts = [alert for sli in slis for alert in _sli_alerts(sli, pool)]
    availability = slis[0]
    alerts.append(
        _alert(
            "LlmfleetErrorRateAboveSlo",
            f'{availability.recorded(_ERROR_RATE_WINDOW)}{{pool="{pool.name}"}} > {pool.slo.error_rate:g}',
            "5m",
            "critical",
            pool,
            f"5xx share over {_ERROR_RATE_WINDOW} above the {pool.slo.error_rate:.2%} error-rate target",
        )
    )
    alerts.append(
        _alert(
            "LlmfleetPreemptions",
            f'sum(rate({PREEMPTIONS}{{{PROM_POOL_LABEL}="{pool.name}"}}[15m])) > 0',
            "15m",
            "warning",
            pool,
            "engines preempt sequences (KV cache pressure or fragmentation)",
        )
    )
    if pool.engine.kv_events:
        alerts += _kv_alerts(pool)
    return [{"name": f"llmfleet-{pool.name}-slo", "rules": [*records, *alerts]}]


def _kv_alerts(pool: PoolSpec) -> list[dict[str, Any]]:
    """KV-aware routing degraded to routing by load: an event stream lost, or no tokenizer to match prompts with."""
    streams = f'max({KV_STREAMS}{{pool="{pool.name}",state="down"}}) > 0'
    tokenizer = f'min({KV_TOKENIZER}{{pool="{pool.name}"}}) == 0'
    return [
        _alert(
            "LlmfleetKvEventStreamsDown",
            streams,
            _WARN_FOR,
            "warning",
            pool,
            "a gateway has lost replicas' KV event streams: kv-cache routes those replicas by load alone",
        ),
        _alert(
            "LlmfleetKvTokenizerMissing",
            tokenizer,
            _WARN_FOR,
            "warning",
            pool,
            "a gateway has no tokenizer for the pool: kv-cache scores nothing, routing is by load alone",
        ),
    ]


def rule_groups(spec: FleetSpec) -> list[dict[str, Any]]:
    """Every pool's rule groups, in the spec's pool order."""
    return [group for pool in spec.pools for group in pool_rule_groups(pool)]


def rules_yaml(spec: FleetSpec) -> str:
    """A Prometheus rule file (``rule_files:``) with every pool's groups."""
    return yaml.safe_dump({"groups": rule_groups(spec)}, sort_keys=False)
