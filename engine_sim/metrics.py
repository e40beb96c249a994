"""Metrics: vLLM V1's Prometheus metrics (names, types, labels, bucket edges) fed by the scheduler.

Names and buckets follow ``vllm/v1/metrics/loggers.py`` (0.32 measured by the differential suite, 0.33 read):
every series carries ``model_name`` (the first served name) and ``engine`` ("0"), but ``admission_rejections``
(``model_name`` and ``reason`` only, as in vLLM); counters are exposed as ``<name>_total``. Latencies are in the
model's clock (seconds of simulated engine time), so ``--time-scale`` changes how fast they accrue, not
their values. Each engine owns its registry: nothing is global.

The prompt's tokens by source: ``prompt_tokens_by_source{source=local_compute|local_cache_hit|external_kv_transfer}``
and ``prompt_tokens_cached`` count each request once, at its first token, from the prefix hit it was first admitted
with (vLLM's ``PromptTokenStats``; ``external_kv_transfer`` the tokens a P/D decode leg pulled, `engine_sim.nixl`);
``prompt_tokens_cached_by_source{source=device}`` follows ``prefix_cache_hits``. With a NixlConnector the engine
also has ``vllm:nixl_xfer_time_seconds`` (`engine_sim.nixl`). What the simulator has no such thing for exists at
zero, as on a vLLM without it: the external (KV connector) prefix-cache counters and multi-modal caches, the
host/p2p/disk tiers, waiting requests ``deferred`` (the simulator defers none: all wait for ``capacity``),
admission rejections (no queue limits), the ``estimated_*_per_gpu`` counters (vLLM fills them only with
``--enable-mfu-metrics``) and ``finished_reason="repetition"``.

Simulator-only series use the ``llmfleet_sim_`` prefix: ``llmfleet_sim_behind_seconds_total`` is how much
model time the real-time driver dropped because the host could not keep up.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine_sim.request import SimRequest
from engine_sim.scheduler import Scheduler, SchedulerStats, StepResult

__all__ = [
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "ITERATION_TOKEN_BUCKETS",
    "TTFT_BUCKETS",
    "EngineMetricsRecorder",
    "buckets_1_2_5",
]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
N_BUCKETS = (1, 2, 5, 10, 20)
_LABELS = ("model_name", "engine")  # on every series
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # vLLM's PromptTokenStats
CACHE_TIERS = ("device", "host", "p2p", "disk", "external_unspecified")  # vLLM's CacheHitSource
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class EngineMetricsRecorder:
    """Owns one registry; ``on_step`` after each step, ``on_finished`` for every finished or aborted request."""

    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, str], engine: str = "0") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._values = (model_name, engine)
        self._lora: Gauge | None = None  # only with --enable-lora, as in vLLM
        self._lora_labels: tuple[str, str, str] | None = None
        self._plain: list[Gauge | Counter | Histogram] = []  # the families labelled (model_name, engine) only
        # Registered in vLLM's order, which is the exposition's order.
        self._add_perf_counters()
        self._add_load_series()
        self._add_latency_histograms()
        self._add_request_histograms(max_model_len)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*cache_info, "engine"],
            registry=self.registry,
        )
        info.labels(*cache_info.values(), engine).set(1)
        self.behind = self._counter(
            "llmfleet_sim_behind_seconds",
            "Model seconds the real-time driver skipped because the host fell behind the model clock.",
        )
        self._seen = SchedulerStats()
        self._bind()

    @property
    def label_values(self) -> tuple[str, str]:
        """The ``(model_name, engine)`` every series carries."""
        return self._values

    def _gauge(self, name: str, doc: str) -> Gauge:
        self._plain.append(gauge := Gauge(name, doc, _LABELS, registry=self.registry))
        return gauge

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        counter = Counter(name, doc, [*_LABELS, *extra], registry=self.registry)
        if not extra:
            self._plain.append(counter)
        return counter

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        self._plain.append(histogram := Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry))
        return histogram

    def _add_perf_counters(self) -> None:
        """vLLM's model-FLOPs-utilization counters, registered always and filled only with --enable-mfu-metrics."""
        for what in ("flops", "read_bytes", "write_bytes"):
            self._counter(f"vllm:estimated_{what}_per_gpu", f"Estimated number of {what} per GPU.")

    def _add_load_series(self) -> None:
        """The batch and KV gauges and the token, cache, preemption and finished-request counters."""
        gauge, counter, v = self._gauge, self._counter, self._values
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason.",
                          [*_LABELS, "reason"], registry=self.registry)  # fmt: skip
        self.waiting_capacity, _ = by_reason.labels(*v, "capacity"), by_reason.labels(*v, "deferred")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        for name, doc in (
            ("external_prefix_cache_queries", "External prefix cache queries from KV connector."),
            ("external_prefix_cache_hits", "External prefix cache hits from KV connector."),
            ("mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
            ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
        ):
            counter(f"vllm:{name}", doc)  # no KV connector, no multi-modal inputs: always 0
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.prompt_computed, self.prompt_hit, self.prompt_external = (
            by_source.labels(*v, source) for source in PROMPT_SOURCES
        )
        self.prompt_cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        by_tier = counter(
            "vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them.",
            ("source",),
        )  # fmt: skip
        self.cached_device, *_ = (by_tier.labels(*v, tier) for tier in CACHE_TIERS)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        for reason in FINISHED_REASONS:
            self.success.labels(*v, reason)
        rejections = Counter(
            "vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"], registry=self.registry,
        )  # fmt: skip
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):  # the simulator has no queue limits
            rejections.labels(v[0], reason)

    def _add_latency_histograms(self) -> None:
        """Per-token (TTFT, ITL) and per-request phase latencies, in model seconds."""
        histogram = self._histogram
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", E2E_BUCKETS
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", E2E_BUCKETS
        )

    def _add_request_histograms(self, max_model_len: int) -> None:
        """Per-request token counts and parameters, and tokens per engine step."""
        histogram = self._histogram
        token_buckets = tuple(float(b) for b in buckets_1_2_5(max_model_len))
        self.req_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.req_gen = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.req_max_gen = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.req_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.req_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", tuple(map(float, N_BUCKETS))
        )
        self.req_preemptions = histogram(
            "vllm:request_num_preemptions", "Number of preemptions per request.", tuple(map(float, PREEMPTION_BUCKETS))
        )
        self.req_prefill_kv = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            tuple(map(float, ITERATION_TOKEN_BUCKETS)),
        )  # fmt: skip

    def _bind(self) -> None:
        v = self._values
        # Create every series up front so a fresh engine exposes zeros rather than missing metrics.
        for metric in self._plain:
            metric.labels(*v)
        self._g = (self.running.labels(*v), self.waiting.labels(*v), self.kv_usage.labels(*v))
        self._ttft, self._itl = self.ttft.labels(*v), self.itl.labels(*v)
        self._iter = self.iteration_tokens.labels(*v)

    def on_step(self, result: StepResult | None, sched: Scheduler) -> None:
        """Refresh gauges and counters after a step (or an abort), observe per-token latencies."""
        running, waiting, usage = self._g
        running.set(sched.num_running)
        waiting.set(sched.num_waiting)
        self.waiting_capacity.set(sched.num_waiting)
        usage.set(sched.kv_usage)
        self._sync_counters(sched.stats)
        if result is None:
            return
        self._iter.observe(result.plan.work.num_tokens)
        ttft, itl = self._ttft, self._itl
        for event in result.events:
            if event.first:
                ttft.observe(event.latency)
                self._count_prompt(event.request)
            else:
                itl.observe(event.latency)

    def _count_prompt(self, request: SimRequest) -> None:
        """A request's prompt by source, once, at its first token (with the hit it was first admitted with)."""
        prompt = request.num_prompt_tokens
        cached = min(prompt, max(0, request.num_cached_tokens))
        external = min(cached, request.num_external_computed_tokens)
        self.prompt_computed.inc(prompt - cached)
        if cached - external:
            self.prompt_hit.inc(cached - external)
        if external:
            self.prompt_external.inc(external)
        if cached:
            self.prompt_cached.labels(*self._values).inc(cached)

    def on_lora(self, max_lora: int, running: set[str], waiting: set[str]) -> None:
        """``vllm:lora_requests_info``: one series whose labels name the adapters of running and waiting requests
        (comma-separated, sorted) and whose value is the wall time of the update, as vLLM exports it."""
        if self._lora is None:
            self._lora = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=self.registry,
            )
        labels = (str(max_lora), ",".join(sorted(waiting)), ",".join(sorted(running)))
        if labels != self._lora_labels:
            self._lora.clear()
            self._lora_labels = labels
        self._lora.labels(*labels).set(time.time())

    def _sync_counters(self, stats: SchedulerStats) -> None:
        seen, v = self._seen, self._values
        for name, metric in (
            ("prompt_tokens", self.prompt_tokens),
            ("generation_tokens", self.generation_tokens),
            ("prefix_queries", self.prefix_queries),
            ("prefix_hits", self.prefix_hits),
            ("preemptions", self.preemptions),
        ):
            delta = getattr(stats, name) - getattr(seen, name)
            if delta:
                metric.labels(*v).inc(delta)
                setattr(seen, name, getattr(stats, name))
                if metric is self.prefix_hits:
                    self.cached_device.inc(delta)  # every local hit comes from the device's (the only) tier

    def on_finished(self, request: SimRequest) -> None:
        v = self._values
        reason = request.finish_reason.value if request.finish_reason else "error"
        self.success.labels(*v, reason).inc()
        arrival, end = request.arrival_time, request.finish_time or request.arrival_time
        self.e2e.labels(*v).observe(max(0.0, end - arrival))
        self.req_prompt.labels(*v).observe(request.num_prompt_tokens)
        self.req_gen.labels(*v).observe(request.num_output_tokens)
        self.req_max_gen.labels(*v).observe(request.num_output_tokens)  # n=1: the one sequence's count
        self.req_prefill_kv.labels(*v).observe(request.num_prompt_tokens - max(0, request.num_cached_tokens))
        self.req_max_tokens.labels(*v).observe(request.max_tokens)
        self.req_n.labels(*v).observe(1)
        self.req_preemptions.labels(*v).observe(request.num_preemptions)
        if request.scheduled_time is not None:
            self.queue.labels(*v).observe(request.scheduled_time - arrival)
        first, last = request.first_token_time, request.last_token_time
        if request.scheduled_time is not None and first is not None and last is not None:
            self.prefill.labels(*v).observe(first - request.scheduled_time)
            self.decode.labels(*v).observe(last - first)
            self.inference.labels(*v).observe(last - request.scheduled_time)
            if request.num_output_tokens > 1:
                self.tpot.labels(*v).observe((last - first) / (request.num_output_tokens - 1))

    def on_behind(self, seconds: float) -> None:
        self.behind.labels(*self._values).inc(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
