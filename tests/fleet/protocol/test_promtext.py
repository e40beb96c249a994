"""The Prometheus text parser reads vLLM's exposition and never turns a broken scrape into zeros."""

from __future__ import annotations

import pytest

from fleet.protocol.promtext import (
    EngineMetrics,
    diff_buckets,
    engine_asleep,
    histogram_buckets,
    histogram_quantile,
    parse,
)

SCRAPE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.42
vllm:num_preemptions_total{engine="0",model_name="qwen"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1000.0
vllm:generation_tokens_total{engine="0",model_name="qwen"} 500.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen"} 50.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="qwen"} 90.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 100.0
vllm:cache_config_info{block_size="16",engine="0",label="a \\"quoted\\" value"} 1.0
"""


def test_engine_metrics_from_a_vllm_scrape() -> None:
    metrics = EngineMetrics.from_text(SCRAPE)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (7.0, 3.0, 0.42)
    assert (metrics.prompt_tokens, metrics.generation_tokens, metrics.preemptions) == (1000.0, 500.0, 2.0)
    assert metrics.prefix_queries == 0.0


def test_labels_with_escaped_quotes() -> None:
    [sample] = parse(SCRAPE)["vllm:cache_config_info"]
    assert sample.labels["label"] == 'a "quoted" value'


def test_missing_required_metric_is_an_error_not_zero() -> None:
    with pytest.raises(KeyError):
        EngineMetrics.from_text(SCRAPE.replace("vllm:num_requests_waiting", "other_metric"))


def test_malformed_line_names_its_line_number() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse("ok 1\nbroken{ 1 2 3 4\n")


@pytest.mark.parametrize(("q", "expected"), [(0.5, 0.1), (0.7, 0.175), (0.99, 0.25)])
def test_histogram_quantile_interpolates_like_prometheus(q: float, expected: float) -> None:
    buckets = histogram_buckets(parse(SCRAPE), "vllm:time_to_first_token_seconds")
    assert histogram_quantile(buckets, q) == pytest.approx(expected)


def test_quantile_of_an_empty_histogram_is_none() -> None:
    assert histogram_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.99) is None


def test_bucket_difference_gives_recent_observations() -> None:
    before = [(0.1, 50.0), (0.25, 90.0), (float("inf"), 100.0)]
    now = [(0.1, 50.0), (0.25, 90.0), (float("inf"), 110.0)]
    assert histogram_quantile(diff_buckets(now, before), 0.5) == 0.25


def _sleep_state(awake: float) -> str:
    return "".join(
        f'vllm:engine_sleep_state{{engine="0",model_name="qwen",sleep_state="{state}"}} {value}\n'
        for state, value in (("awake", awake), ("weights_offloaded", 1.0 - awake), ("discard_all", 0.0))
    )


def test_an_engine_is_asleep_only_when_its_awake_sleep_state_is_zero() -> None:
    assert engine_asleep(parse(_sleep_state(0.0)))
    assert not engine_asleep(parse(_sleep_state(1.0)))
    assert not engine_asleep(parse(SCRAPE))  # no sleep mode: no series, awake
