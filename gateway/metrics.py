"""Metrics: the gateway's Prometheus series and its JSON access log.

Series (prefix ``llmfleet_gateway_``), labelled by tenant, model, status and replica where it makes sense:
requests_total, ttft_seconds (streamed answers only: a whole answer has no first token to time) and e2e_seconds (as
seen by the gateway), tokens_total{direction=in|out}, queue_depth / queue_wait_seconds, retries_total{reason},
ejections_total, routed_total (routing decisions), alias_routed_total{alias,pool} (requests for an alias, by the
pool that took them), routing_plugin_seconds{plugin}, overhead_seconds (time spent in the gateway itself, upstream
time excluded), in_flight{replica}, prefill_tokens{pool,replica} and context_tokens{pool,replica} (this gateway's
open requests' prompt tokens not yet answered, less the cached share expected, and those answered: the
``least-work`` picker's counts), ready_replicas{pool}; with a shared quota store (`watch_quota`), quota_store_up
(1/0) and quota_store_down_requests_total{decision=local|refused} (requests decided without the store);
pd_requests_total{model,path} (requests to a disaggregated pool: two legs, aggregated by the decision, or done
aggregated after a leg failed, `gateway.two_legs`); resumed_streams_total{model,outcome=completed|failed} (streams
broken mid-way that were to be resumed on another replica: completed seamlessly, or failed and ended with the error
event); for pools routed by ``kv-cache`` (`gateway.kv_events`): kv_event_streams{pool,state=up|down} (a replica's
stream down: its entries dropped, the load scorers decide for it), kv_index_blocks{pool}, kv_event_batches_total,
kv_event_gaps_total, kv_event_malformed_total, kv_prompt_blocks_total and kv_hit_blocks_total{pool} (full prompt
blocks routed, and of those the ones the chosen replica's engine held: the index's hit rate),
kv_blocks_skipped_total{pool,reason} (stored blocks the index did not take: reason parent, medium, block_size or
malformed, `gateway.routing.kv_index`), kv_block_size{pool} (the tokens per block prompts are hashed with: pinned,
or learned from the events; 0 until learned), prompt_tokens_available{pool} (1: the gateway has the pool's
tokenizer; 0: it has none, from its folder or the model store, and kv-cache scores nothing for the pool);
client_errors_total{kind} (requests a client got wrong or abandoned, `CLIENT_ERROR_KINDS`, each also one log line on
``llmfleet.gateway.client``: never a traceback, as none is the gateway's fault).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.endpoints import EndpointSet
    from gateway.kv_events import KvEventFeed
    from gateway.quota.base import QuotaBackend

__all__ = ["CLIENT_ERROR_KINDS", "AccessLog", "GatewayMetrics"]

# What a client can get wrong or abandon (docs/gateway.md, "Failures"): a header the gateway reads that is
# repeated or not ASCII; a request line or header over the size limits; HTTP the parser refuses (bad method,
# control characters, a repeated Content-Length, broken chunk framing); a malformed request target; a body in an
# unsupported or mismatched Content-Encoding; a body that is not UTF-8 JSON or is cut short; a body that stalled
# past timeouts.bodyReadS; a client gone before its answer was complete.
CLIENT_ERROR_KINDS = (
    "header",
    "too_large",
    "malformed",
    "url",
    "encoding",
    "body",
    "body_timeout",
    "disconnect",
)
_client_log = logging.getLogger("llmfleet.gateway.client")

# 200 (the denominator), 429 (quota, not an error) and the 5xx an answer can have: the availability SLI's series.
_SLO_STATUSES = ("200", "429", "500", "502", "503", "504")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)
_FAST = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class GatewayMetrics:
    """One registry per gateway (no globals): tests and several apps in one process never collide."""

    def __init__(self, registry: CollectorRegistry | None = None, ttft_slo_s: Iterable[float] = ()) -> None:
        """``ttft_slo_s``: the pools' TTFT thresholds (`fleet.slo.rules.ttft_slo_edges`), added to the TTFT
        histogram's edges so that the SLO rules count requests slower than each threshold exactly."""
        self.registry = r = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        p = "llmfleet_gateway_"
        self.requests = Counter(p + "requests", "Requests answered", ["tenant", "model", "status"], registry=r)
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Time to first token",
            ["tenant", "model"],
            buckets=sorted({*_LATENCY, *ttft_slo_s}),
            registry=r,
        )
        self.e2e = Histogram(
            p + "e2e_seconds", "Request latency, end to end", ["tenant", "model"], buckets=_LATENCY, registry=r
        )
        self.tokens = Counter(p + "tokens", "Tokens", ["tenant", "model", "direction"], registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for admission", ["model"], registry=r)
        self.queue_wait = Histogram(
            p + "queue_wait_seconds", "Time waited for admission", ["model", "priority"], buckets=_LATENCY, registry=r
        )
        self.retries = Counter(p + "retries", "Retries on another replica", ["model", "reason"], registry=r)
        self.ejections = Counter(p + "ejections", "Replicas ejected", ["pool", "replica"], registry=r)
        self.pd_requests = Counter(
            p + "pd_requests", "Requests to disaggregated pools, by the path taken", ["model", "path"], registry=r
        )
        self.routed = Counter(p + "routed", "Routing decisions", ["model", "replica"], registry=r)
        self.alias_routed = Counter(
            p + "alias_routed", "Requests for an alias, by the pool chosen", ["alias", "pool"], registry=r
        )
        self.plugin = Histogram(
            p + "routing_plugin_seconds", "Routing plugin latency", ["plugin"], buckets=_FAST, registry=r
        )
        self.overhead = Histogram(
            p + "overhead_seconds", "Gateway time excluding upstream and queueing", ["model"], buckets=_FAST, registry=r
        )
        self.in_flight = Gauge(p + "in_flight", "Requests on each replica", ["pool", "replica"], registry=r)
        self.ready = Gauge(p + "ready_replicas", "Routable replicas", ["pool"], registry=r)
        self.prompt_tokens = Gauge(
            p + "prompt_tokens_available",
            "Pools routed by kv-cache: 1 with the pool's tokenizer, 0 without (kv-cache scores nothing for it)",
            ["pool"],
            registry=r,
        )
        self.resumed_streams = Counter(
            p + "resumed_streams",
            "Streams broken mid-way that were to be resumed on another replica, by outcome",
            ["model", "outcome"],
            registry=r,
        )
        self.client_errors = Counter(
            p + "client_errors", "Requests a client got wrong or abandoned, by kind", ["kind"], registry=r
        )
        for kind in CLIENT_ERROR_KINDS:  # at 0 from the start: rate() sees the first one
            self.child(self.client_errors, kind)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoised: prometheus_client's own lookup takes a lock on every call."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def client_error(self, kind: str, detail: str, remote: str | None) -> None:
        """Count one client error of ``kind`` (one of `CLIENT_ERROR_KINDS`) and log it on one line, at INFO: the
        client's doing, so no traceback and no warning. ``detail`` is cut to 200 characters."""
        if kind not in CLIENT_ERROR_KINDS:
            raise ValueError(f"client error kind {kind!r}: not one of {', '.join(CLIENT_ERROR_KINDS)}")
        self.child(self.client_errors, kind).inc()
        _client_log.info("client error kind=%s remote=%s: %s", kind, remote or "-", ascii(detail[:200]))

    def start_at_zero(self, tenants: Sequence[str], models: Sequence[str]) -> None:
        """Export ``requests_total`` at 0 for every tenant and model with the statuses the SLOs count, before any
        request: a series that first appears at its first increment starts at that value, and ``rate()`` and
        ``increase()`` never see that first step, so a pool's first burst of errors would be missed by the
        availability SLI, its alerts and the error budget."""
        for tenant in tenants:
            for model in models:
                for status in _SLO_STATUSES:
                    self.child(self.requests, tenant, model, status)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def watch_quota(self, quota: QuotaBackend) -> None:
        """Export ``quota``'s store health on every render (nothing for a backend without a shared store)."""
        self.registry.register(_QuotaStoreCollector(quota))

    def watch_endpoints(self, endpoints: EndpointSet) -> None:
        """Export each member replica's token counts (``least-work``'s: `Endpoint.prefill_tokens` and
        ``context_tokens``) on every render: read where they are kept, not counted twice per request."""
        self.registry.register(_EndpointTokensCollector(endpoints))

    def watch_kv(self, feed: KvEventFeed) -> None:
        """Export the KV event feed's streams and the kv-cache scorers' index and hits on every render (nothing for
        a gateway whose routers do not score with kv-cache)."""
        from gateway.kv_events import KvFeedCollector  # the feed imports routing; metrics stays below it

        self.registry.register(KvFeedCollector(feed))


class _EndpointTokensCollector(Collector):
    """Reads the member replicas' token counts at scrape time; a replica that left has no series."""

    def __init__(self, endpoints: EndpointSet) -> None:
        self._endpoints = endpoints

    def collect(self) -> Iterable[Metric]:
        p, labels = "llmfleet_gateway_", ["pool", "replica"]
        unanswered = "Prompt tokens of open requests not yet answered, less the cached share expected"
        prefill = GaugeMetricFamily(p + "prefill_tokens", unanswered, labels=labels)
        answered = "Prompt tokens of open requests the replica answered"
        context = GaugeMetricFamily(p + "context_tokens", answered, labels=labels)
        for pool in self._endpoints.pools:
            for ep in self._endpoints.members(pool):
                prefill.add_metric([pool, ep.id], ep.prefill_tokens)
                context.add_metric([pool, ep.id], ep.context_tokens)
        yield from (prefill, context)


class _QuotaStoreCollector(Collector):
    """Reads `QuotaBackend.health` at scrape time, so the backend keeps plain counters and no registry."""

    def __init__(self, quota: QuotaBackend) -> None:
        self._quota = quota

    def collect(self) -> Iterable[Metric]:
        health = self._quota.health()
        if health is None:
            return
        p = "llmfleet_gateway_"
        yield GaugeMetricFamily(
            p + "quota_store_up", "1 while the shared quota store answers, 0 while it does not", value=int(health.up)
        )
        down = CounterMetricFamily(
            p + "quota_store_down_requests",
            "Requests whose quota was decided without the shared store: counted locally or refused (503)",
            labels=["decision"],
        )
        down.add_metric(["local"], health.decided_locally)
        down.add_metric(["refused"], health.refused)
        yield down


class AccessLog:
    """One JSON line per request on logger ``llmfleet.gateway.access``."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("llmfleet.gateway.access")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._log.isEnabledFor(logging.INFO):
            self._log.info(json.dumps(record, separators=(",", ":")))
