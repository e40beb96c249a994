"""SseRelay: event splitting across reads, [DONE], usage taken and hidden when the client did not ask."""

from __future__ import annotations

from typing import Any, cast

import aiohttp
import pytest

from gateway.proxy import SseRelay

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(("hide", "expect_usage_event"), [(True, False), (False, True)])
def test_relay_counts_events_and_takes_usage(hide: bool, expect_usage_event: bool) -> None:
    relay = SseRelay(cast(Any, None), hide_usage=hide)
    stream = CHUNK + CHUNK + USAGE + DONE
    sent = b""
    for i in range(0, len(stream), 7):  # arbitrary TCP read boundaries
        sent += relay.feed(stream[i : i + 7])
    assert relay.done and relay.events == 4
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens) == (5, 2)
    assert (USAGE in sent) is expect_usage_event
    assert sent.endswith(DONE) and sent.count(CHUNK) == 2


def test_scrape_filter_keeps_exactly_the_load_series() -> None:
    from fleet.protocol.promtext import EngineMetrics
    from gateway.endpoints import load_lines

    text = "\n".join(
        [
            "# HELP vllm:num_requests_running x",
            'vllm:num_requests_running{model_name="m"} 3.0',
            'vllm:num_requests_waiting{model_name="m"} 2.0',
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 2.0',
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5',
            'vllm:num_preemptions_total{model_name="m"} 0.0',
            'vllm:prompt_tokens_total{model_name="m"} 10.0',
            'vllm:generation_tokens_total{model_name="m"} 20.0',
            'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0',
        ]
    )
    metrics = EngineMetrics.from_text(load_lines(text))
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (3.0, 2.0, 0.5)


class _NoConnection:
    """A client session whose every connection attempt runs out of time (aiohttp's connect timeout)."""

    async def post(self, *args: Any, **kwargs: Any) -> Any:
        raise aiohttp.ConnectionTimeoutError("Connection timeout to host")


async def test_a_connect_timeout_is_a_connect_failure_another_replica_may_take_not_a_first_token_timeout() -> None:
    from gateway.errors import UpstreamConnectError
    from gateway.proxy import Timeouts, open_stream

    timeouts = Timeouts(connect_s=2.0, first_token_s=30.0, total_s=60.0)
    with pytest.raises(UpstreamConnectError, match="no connection within 2s") as raised:
        await open_stream(cast(Any, _NoConnection()), "http://engine", b"{}", {}, timeouts, hide_usage=False)
    assert raised.value.retryable
