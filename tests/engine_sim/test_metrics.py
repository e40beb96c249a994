"""/metrics: vLLM V1 names, types, labels and bucket edges, readable by `fleet.protocol.promtext`."""

from __future__ import annotations

import asyncio
import re

import pytest

from engine_sim.metrics import buckets_1_2_5
from fleet.protocol import promtext
from tests.engine_sim.conftest import sim_server, sse_events

# (exposed family name, type) for every metric the fleet reads or vLLM 0.33 publishes by default.
FAMILIES = [
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:prefix_cache_queries_total", "counter"),
    ("vllm:prefix_cache_hits_total", "counter"),
    ("vllm:prompt_tokens_total", "counter"),
    ("vllm:generation_tokens_total", "counter"),
    ("vllm:num_preemptions_total", "counter"),
    ("vllm:request_success_total", "counter"),
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:inter_token_latency_seconds", "histogram"),
    ("vllm:request_time_per_output_token_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:request_queue_time_seconds", "histogram"),
    ("vllm:request_inference_time_seconds", "histogram"),
    ("vllm:request_prefill_time_seconds", "histogram"),
    ("vllm:request_decode_time_seconds", "histogram"),
    ("vllm:request_prompt_tokens", "histogram"),
    ("vllm:request_generation_tokens", "histogram"),
    ("vllm:request_params_max_tokens", "histogram"),
    ("vllm:request_params_n", "histogram"),
    ("vllm:request_num_preemptions", "histogram"),
    ("vllm:iteration_tokens_total", "histogram"),
    ("vllm:cache_config_info", "gauge"),
    # Exported by vLLM 0.32 (the differential suite's scrape) with nothing or zeros behind them in the simulator.
    ("vllm:estimated_flops_per_gpu_total", "counter"),
    ("vllm:estimated_read_bytes_per_gpu_total", "counter"),
    ("vllm:estimated_write_bytes_per_gpu_total", "counter"),
    ("vllm:num_requests_waiting_by_reason", "gauge"),
    ("vllm:external_prefix_cache_queries_total", "counter"),
    ("vllm:external_prefix_cache_hits_total", "counter"),
    ("vllm:mm_cache_queries_total", "counter"),
    ("vllm:mm_cache_hits_total", "counter"),
    ("vllm:prompt_tokens_by_source_total", "counter"),
    ("vllm:prompt_tokens_cached_total", "counter"),
    ("vllm:prompt_tokens_cached_by_source_total", "counter"),
    ("vllm:request_max_num_generation_tokens", "histogram"),
    ("vllm:request_prefill_kv_computed_tokens", "histogram"),
]

TTFT = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
    80,
    160,
    640,
    2560,
]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
E2E = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]
BUCKETS = [
    ("vllm:time_to_first_token_seconds", TTFT),
    ("vllm:inter_token_latency_seconds", ITL),
    ("vllm:request_time_per_output_token_seconds", ITL),
    ("vllm:e2e_request_latency_seconds", E2E),
    ("vllm:request_queue_time_seconds", E2E),
    ("vllm:request_prefill_time_seconds", E2E),
    ("vllm:request_decode_time_seconds", E2E),
    ("vllm:iteration_tokens_total", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]),
    ("vllm:request_prompt_tokens", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]),
]


async def _scrape_after_traffic() -> str:
    async with sim_server() as sim:
        body = {"model": "qwen", "prompt": list(range(40)), "max_tokens": 4, "stream": True}
        for _ in range(2):
            await sse_events(sim.client, "/v1/completions", body)
        return await sim.metrics_text()


@pytest.fixture(scope="module")
def scraped() -> str:
    """One scrape shared by the table-driven checks below (one server, two streamed requests)."""
    return asyncio.run(_scrape_after_traffic())


@pytest.mark.parametrize(("name", "kind"), FAMILIES)
def test_every_vllm_metric_is_exposed_with_its_type_and_labels(scraped: str, name: str, kind: str) -> None:
    family = name.removesuffix("_total") if kind == "counter" else name
    assert re.search(
        rf"^# TYPE {re.escape(family if kind != 'counter' else family + '_total')} {kind}$", scraped, re.M
    ) or (kind == "counter" and re.search(rf"^# TYPE {re.escape(family)} counter$", scraped, re.M))
    samples = promtext.parse(scraped)
    key = f"{name}_bucket" if kind == "histogram" else name
    assert samples[key], f"no samples for {key}"
    for sample in samples[key]:
        assert sample.labels["engine"] == "0"
        if name != "vllm:cache_config_info":
            assert sample.labels["model_name"] == "qwen"


@pytest.mark.parametrize(("name", "edges"), BUCKETS)
def test_histogram_bucket_edges_match_vllm(scraped: str, name: str, edges: list[float]) -> None:
    bounds = [b for b, _ in promtext.histogram_buckets(promtext.parse(scraped), name)]
    assert bounds == [float(e) for e in edges] + [float("inf")]


def test_engine_metrics_parser_reads_the_scrape(scraped: str) -> None:
    metrics = promtext.EngineMetrics.from_text(scraped)
    assert metrics.generation_tokens == 8 and metrics.prompt_tokens == 80
    assert metrics.prefix_queries == 80 and metrics.prefix_hits == 32  # 2 full blocks; last token recomputed
    assert metrics.running == metrics.waiting == metrics.kv_usage == 0
    quantile = promtext.histogram_quantile(metrics.ttft_buckets, 0.99)
    # A 40-token prefill is ~20 ms of model time; a busy machine's scheduling adds to the wall-clock TTFT, so the
    # bound has room for it and still fails on a unit slip (milliseconds taken as seconds) or an empty histogram.
    assert quantile is not None and 0 < quantile < 0.5


def test_cache_config_info_publishes_the_kv_capacity(scraped: str) -> None:
    (sample,) = promtext.parse(scraped)["vllm:cache_config_info"]
    assert sample.value == 1 and sample.labels["block_size"] == "16" and int(sample.labels["num_gpu_blocks"]) > 60000


def test_token_buckets_follow_the_1_2_5_series() -> None:
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)


def _by(samples: dict[str, list[promtext.Sample]], name: str, label: str) -> dict[str, float]:
    return {sample.labels[label]: sample.value for sample in samples[name]}


def test_prompt_tokens_split_by_source_as_vllm_counts_them(scraped: str) -> None:
    """Two 40-token prompts, the second admitted with a 32-token prefix hit: computed 48, cached 32 (device)."""
    samples = promtext.parse(scraped)
    by_source = _by(samples, "vllm:prompt_tokens_by_source_total", "source")
    assert by_source == {"local_compute": 48, "local_cache_hit": 32, "external_kv_transfer": 0}
    assert samples["vllm:prompt_tokens_cached_total"][0].value == 32
    tiers = _by(samples, "vllm:prompt_tokens_cached_by_source_total", "source")
    assert tiers == {"device": 32, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": 0}
    assert samples["vllm:request_prefill_kv_computed_tokens_sum"][0].value == 48
    assert samples["vllm:request_max_num_generation_tokens_sum"][0].value == 8


def test_label_values_are_vllms_and_what_never_happens_is_zero(scraped: str) -> None:
    samples = promtext.parse(scraped)
    assert set(_by(samples, "vllm:request_success_total", "finished_reason")) == {
        "stop", "length", "abort", "error", "repetition"
    }  # fmt: skip
    assert _by(samples, "vllm:num_requests_waiting_by_reason", "reason") == {"capacity": 0, "deferred": 0}
    rejections = samples["vllm:admission_rejections_total"]
    assert {s.labels["reason"] for s in rejections} == {"max_num_queued_reqs", "max_num_queued_tokens"}
    assert all(set(s.labels) == {"model_name", "reason"} and s.value == 0 for s in rejections)  # no engine label
    for name in ("vllm:external_prefix_cache_hits_total", "vllm:mm_cache_queries_total"):
        assert [s.value for s in samples[name]] == [0]
