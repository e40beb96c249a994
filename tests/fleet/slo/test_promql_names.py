"""PromQL names: metric names and label values out of PromQL expressions, and series missing from expositions."""

from __future__ import annotations

import pytest

from fleet.slo.promql_names import exposed_names, label_values, metric_names, missing_series

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="q"} 0.0
# HELP requests_total Requests answered
# TYPE requests_total counter
# HELP ttft_seconds Time to first token
# TYPE ttft_seconds histogram
ttft_seconds_bucket{le="0.3",model="q"} 1.0
ttft_seconds_bucket{le="+Inf",model="q"} 1.0
ttft_seconds_count{model="q"} 1.0
ttft_seconds_sum{model="q"} 0.1
"""


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("vllm:num_requests_running", {"vllm:num_requests_running"}),
        ('sum by (le) (rate(a_bucket{x="}{", le="0.3"}[5m])) > 1e-3', {"a_bucket"}),
        ("histogram_quantile(0.99, sum without (x) (rate(a_bucket[5m:1m]))) * 2 offset 5m", {"a_bucket"}),
        ('{__name__="up", job="x"} == bool 1 unless absent(y) or vector(0) + Inf', {"up", "y"}),
        ("max_over_time(rate(z_total[5m])[1h:5m]) / ignoring(le) group_left(a, b) w", {"z_total", "w"}),
        ("sum (rate(x[5m] @ 1609746000)) and on (pool) NaN < 0x1f", {"x"}),
        ("llmfleet:pool_request_errors:ratio_rate1h{pool=\"p\"} > 14.4 * 0.001", {
            "llmfleet:pool_request_errors:ratio_rate1h"}),
    ],
)  # fmt: skip
def test_metric_names_are_the_selected_series_not_functions_labels_or_keywords(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_label_values_are_the_equality_matchers_of_a_label() -> None:
    expr = 'rate(a_bucket{le="0.3"}[5m]) / rate(b_bucket{le=~"0.5|1"}[5m]) + c{le!="2"}'
    assert label_values(expr, "le") == {"0.3"}


def test_exposed_names_include_series_a_labelled_family_promises_before_its_first_sample() -> None:
    assert exposed_names(EXPOSITION) == {
        "vllm:num_requests_running",
        "requests_total",
        "requests_created",
        "ttft_seconds_bucket",
        "ttft_seconds_count",
        "ttft_seconds_sum",
        "ttft_seconds_created",
    }


def test_missing_series_names_unknown_metrics_and_bucket_edges_and_skips_recorded_names() -> None:
    exprs = [
        'rate(requests_total[5m]) + rate(ttft_seconds_bucket{le="0.3"}[5m]) + pool:ratio',
        'rate(ttft_seconds_bucket{le="0.25"}[5m])',
        "rate(vllm:time_per_output_token_seconds_count[5m])",
    ]
    assert missing_series(exprs, [EXPOSITION], recorded={"pool:ratio"}) == [
        f"ttft_seconds_bucket{{le='0.25'}} in {exprs[1]!r}",
        f"vllm:time_per_output_token_seconds_count in {exprs[2]!r}",
    ]
