"""Timeseries: a client's events bucketed into per-second intervals, each request counted once."""

from __future__ import annotations

import pytest

from llmfleet.local.timeseries import Interval, ReadySample, Recorder, Timeline, quantile


def _recorded() -> Recorder:
    """Five requests over three seconds: three ok (one ending after the last send), one 503, one cut stream."""
    r = Recorder()
    for at in (0.1, 0.5, 1.2, 1.9, 2.4):
        r.on_sent(at)
    r.on_ok(0.4, latency_s=0.3, ttft_s=0.1)
    r.on_ok(1.5, latency_s=1.0, ttft_s=0.2)
    r.on_error(1.3, "503")
    r.on_error(2.1, "stream")
    r.on_ok(2.9, latency_s=1.0, ttft_s=None)  # not streamed: a latency but no TTFT
    r.on_ready(0.0, {"qwen-7b": 1})
    r.on_ready(2.0, {"qwen-7b": 2, "small": 0})
    return r


def test_every_request_is_sent_in_one_interval_and_ends_in_one() -> None:
    timeline = _recorded().timeline(1.0)
    assert [i.start_s for i in timeline.intervals] == [0.0, 1.0, 2.0]
    assert [i.sent for i in timeline.intervals] == [2, 2, 1]
    assert [i.completed for i in timeline.intervals] == [1, 1, 1]
    assert [dict(i.errors) for i in timeline.intervals] == [{}, {"503": 1}, {"stream": 1}]
    assert timeline.sent == 5 and timeline.completed + sum(timeline.errors.values()) == 5
    assert timeline.statuses() == ["503", "stream"]


def test_latency_quantiles_belong_to_the_interval_the_request_ended_in() -> None:
    first, second, third = _recorded().timeline(1.0).intervals
    assert (first.ttft_p50_s, first.latency_p99_s) == (0.1, 0.3)
    assert (second.ttft_p99_s, second.latency_p50_s) == (0.2, 1.0)
    assert third.ttft_p50_s is None and third.latency_p50_s == 1.0


def test_the_timeline_reaches_the_end_of_the_run_even_when_the_last_seconds_were_quiet() -> None:
    timeline = _recorded().timeline(1.0, end_s=5.0)
    assert len(timeline.intervals) == 5 and timeline.intervals[-1].sent == 0
    assert timeline.pools() == ["qwen-7b", "small"]


def test_an_interval_length_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Recorder().timeline(0)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([3.0], 0.99, 3.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
        ([float(n) for n in range(100)], 0.99, 98.0),
    ],
)
def test_quantile_is_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert quantile(values, q) == expected


def test_a_bounded_timeline_drops_its_oldest_intervals_and_their_ready_samples() -> None:
    timeline = Timeline()
    for n in range(5):
        timeline = timeline.with_interval(Interval(float(n), 1.0, n, n, {}), [ReadySample(n + 1.0, "p", n)], keep=3)
    assert [i.sent for i in timeline.intervals] == [2, 3, 4]
    assert [s.ready for s in timeline.ready] == [1, 2, 3, 4]  # samples from the first kept interval's start on
