"""Request spans: the phases of streamed, non-streamed, retried and rejected requests in the caller's trace, the
trace context each engine receives, and ``gateway.tracing`` from the stack to an OTLP collector."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fleet.spec.errors import SpecError
from gateway.tracing import TracingUnavailable, provider_for, traces_url
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, spec, write_stack
from tests.support.wait import async_wait_for

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}
PHASES = ["auth", "quota", "queued", "route", "upstream"]


class Traced:
    """An SDK provider whose spans land in memory, and the headers of every completion the gateway sends upstream
    (read from its aiohttp client as it sends them)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.sent: list[dict[str, str]] = []

    def session(self) -> aiohttp.ClientSession:
        async def on_start(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
            del session, context  # Unused.
            if params.url.path.startswith("/v1/"):
                self.sent.append(dict(params.headers))

        hooks = aiohttp.TraceConfig()
        hooks.on_request_start.append(on_start)
        return aiohttp.ClientSession(auto_decompress=False, trace_configs=[hooks])

    def trace(self, trace_id: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.context and f"{s.context.trace_id:032x}" == trace_id]

    async def wait_request(self, trace_id: str) -> list[ReadableSpan]:
        """The spans of one request's trace, once its server span has ended."""

        def done() -> list[ReadableSpan] | None:
            spans = self.trace(trace_id)
            return spans if any(s.kind is SpanKind.SERVER for s in spans) else None

        return await async_wait_for(done, timeout_s=20, what=f"the server span of trace {trace_id}")


def _traceparent() -> tuple[str, str, str]:
    """A caller's sampled traceparent: (header, trace id, parent span id)."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent}-01", trace_id, parent


async def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=json.dumps(body), headers=headers) as resp:
            return resp.status, await resp.read()


def _one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def _check_tree(spans: Sequence[ReadableSpan], parent: str) -> ReadableSpan:
    """The server span is the caller's span's child and every other span is the server span's; returns it."""
    server = _one(spans, "POST /v1/chat/completions")
    assert server.kind is SpanKind.SERVER and server.parent is not None
    assert f"{server.parent.span_id:016x}" == parent and server.parent.is_remote
    for span in spans:
        if span is not server:
            assert span.parent is not None and span.parent.span_id == server.context.span_id, span.name
    return server


@pytest.fixture
async def traced_gateway(shared_sim: Proc) -> AsyncIterator[tuple[str, Traced]]:
    traced = Traced()
    async with serve(
        settings_for([shared_sim.url]), session_factory=traced.session, tracer_provider=traced.provider
    ) as (
        url,
        _,
    ):
        yield url, traced


async def test_a_non_streamed_chat_is_one_trace_with_every_phase_under_the_callers_span(
    traced_gateway: tuple[str, Traced],
) -> None:
    url, traced = traced_gateway
    header, trace_id, parent = _traceparent()
    status, _ = await _post(url, CHAT, {**GOLD, "traceparent": header})
    assert status == 200
    spans = await traced.wait_request(trace_id)
    assert sorted(s.name for s in spans) == sorted([*PHASES, "POST /v1/chat/completions"])
    server = _check_tree(spans, parent)
    attrs = server.attributes or {}
    assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200
    assert (attrs["llmfleet.tenant"], attrs["gen_ai.request.model"], attrs["llmfleet.pool"]) == (
        "gold",
        MODEL,
        "qwen-7b",
    )
    assert attrs["llmfleet.replica"] == "qwen-7b-static-0" and attrs["llmfleet.priority"] == 8
    assert int(attrs["gen_ai.usage.input_tokens"]) > 0 and 0 < int(attrs["gen_ai.usage.output_tokens"]) <= 8
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["llmfleet.retries"] == 0
    assert server.status.status_code is StatusCode.UNSET
    upstream = _one(spans, "upstream")
    assert upstream.kind is SpanKind.CLIENT
    assert (upstream.attributes or {})["llmfleet.replica"] == "qwen-7b-static-0"
    assert (upstream.attributes or {})["http.response.status_code"] == 200
    assert (_one(spans, "route").attributes or {})["llmfleet.routing.picker"] == "p2c"
    # The engine's own spans would join the trace under the upstream span.
    assert [h["traceparent"] for h in traced.sent] == [f"00-{trace_id}-{_span_id(upstream)}-01"]


async def test_a_streamed_chat_adds_a_streaming_span_with_the_token_counts(traced_gateway: tuple[str, Traced]) -> None:
    url, traced = traced_gateway
    header, trace_id, parent = _traceparent()
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    status, text = await _post(url, body, {**GOLD, "traceparent": header})
    assert status == 200 and text.endswith(b"data: [DONE]\n\n")
    spans = await traced.wait_request(trace_id)
    assert sorted(s.name for s in spans) == sorted([*PHASES, "streaming", "POST /v1/chat/completions"])
    server = _check_tree(spans, parent)
    streaming, upstream = _one(spans, "streaming"), _one(spans, "upstream")
    assert upstream.end_time is not None and streaming.start_time is not None
    assert upstream.end_time <= streaming.start_time  # upstream: until the first token; streaming: from it on
    output = (server.attributes or {})["gen_ai.usage.output_tokens"]
    assert 0 < int(output) <= 8 and (streaming.attributes or {})["gen_ai.usage.output_tokens"] == output
    assert (server.attributes or {})["gen_ai.request.stream"] is True
    assert [h["traceparent"] for h in traced.sent] == [f"00-{trace_id}-{_span_id(upstream)}-01"]


async def test_a_retried_request_shows_one_upstream_span_per_attempt(sims: SimFactory) -> None:
    refusing, good = sims(["--fault-error-rate", "1", "--fault-error-status", "503"], [])
    traced = Traced()
    settings = settings_for([refusing.url, good.url], **{"gateway.routing.picker": {"name": "round-robin"}})
    async with serve(settings, session_factory=traced.session, tracer_provider=traced.provider) as (url, gw):
        await async_wait_for(lambda: gw.endpoints.routable("qwen-7b") == 2, timeout_s=20, what="both replicas routable")
        traces = []
        for _ in range(2):  # round-robin: one of the first two requests goes to the refusing replica first
            header, trace_id, parent = _traceparent()
            assert (await _post(url, CHAT, {**GOLD, "traceparent": header}))[0] == 200
            traces.append((trace_id, parent))
    retried = [(t, p) for t, p in traces if len([s for s in traced.trace(t) if s.name == "upstream"]) == 2]
    assert len(retried) == 1, [[s.name for s in traced.trace(t)] for t, _ in traces]
    trace_id, parent = retried[0]
    spans = traced.trace(trace_id)
    server = _check_tree(spans, parent)
    first, second = sorted((s for s in spans if s.name == "upstream"), key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "UpstreamUnavailable"
    assert (first.attributes or {})["llmfleet.replica"] == "qwen-7b-static-0"
    assert (second.attributes or {})["llmfleet.retry.reason"] == "UpstreamUnavailable"
    assert (second.attributes or {})["llmfleet.replica"] == "qwen-7b-static-1"
    assert (server.attributes or {})["llmfleet.retries"] == 1 and (server.attributes or {})["llmfleet.attempts"] == 2
    assert len([s for s in spans if s.name == "route"]) == 2
    # Each attempt names its own span upstream, in the caller's trace.
    sent = [h["traceparent"] for h in traced.sent if trace_id in h["traceparent"]]
    assert sent == [f"00-{trace_id}-{_span_id(first)}-01", f"00-{trace_id}-{_span_id(second)}-01"]


async def test_a_resumed_stream_shows_the_resume_as_another_upstream_span(sims: SimFactory) -> None:
    dying, good = sims(["--fault-die-mid-stream-after-tokens", "5"], [], time_scale=5.0)
    traced = Traced()
    overrides = {"pools.0.resumeStreams": True, "gateway.routing.picker": {"name": "round-robin"}}
    settings = settings_for([dying.url, good.url], **overrides)
    async with serve(settings, session_factory=traced.session, tracer_provider=traced.provider) as (url, gw):
        await async_wait_for(lambda: gw.endpoints.routable("qwen-7b") == 2, timeout_s=20, what="both replicas routable")
        traces = []
        for _ in range(2):  # round-robin: one of the first two streams begins on the dying replica
            header, trace_id, parent = _traceparent()
            body = {**CHAT, "max_tokens": 20, "stream": True}
            status, text = await _post(url, body, {**GOLD, "traceparent": header})
            assert status == 200 and text.endswith(b"data: [DONE]\n\n") and b'"error"' not in text
            traces.append((trace_id, parent))
        spans_of = {t: await traced.wait_request(t) for t, _ in traces}
    resumed = [(t, p) for t, p in traces if len([s for s in spans_of[t] if s.name == "upstream"]) == 2]
    assert len(resumed) == 1, [[s.name for s in spans] for spans in spans_of.values()]
    trace_id, parent = resumed[0]
    spans = spans_of[trace_id]
    server = _check_tree(spans, parent)
    first, second = sorted((s for s in spans if s.name == "upstream"), key=lambda s: s.start_time or 0)
    assert (first.attributes or {})["llmfleet.replica"] == "qwen-7b-static-0"
    assert (second.attributes or {})["llmfleet.replica"] == "qwen-7b-static-1"
    assert (second.attributes or {})["llmfleet.retry.reason"] == "resume"
    streaming = _one(spans, "streaming")
    assert first.end_time is not None and streaming.start_time is not None and streaming.end_time is not None
    assert second.start_time is not None and first.end_time <= streaming.start_time <= second.start_time
    assert (streaming.attributes or {})["llmfleet.resumes"] == 1 and streaming.status.status_code is StatusCode.UNSET
    attrs = server.attributes or {}
    assert (attrs["llmfleet.resumes"], attrs["llmfleet.retries"], attrs["http.response.status_code"]) == (1, 0, 200)
    sent = [h["traceparent"] for h in traced.sent if trace_id in h["traceparent"]]
    assert sent == [f"00-{trace_id}-{_span_id(first)}-01", f"00-{trace_id}-{_span_id(second)}-01"]


async def test_a_stream_broken_after_its_headers_is_a_server_error_sent_as_200(sims: SimFactory) -> None:
    (dying,) = sims(["--fault-die-mid-stream-after-tokens", "5"], time_scale=5.0)
    traced = Traced()
    async with serve(settings_for([dying.url]), session_factory=traced.session, tracer_provider=traced.provider) as (
        url,
        _,
    ):
        header, trace_id, parent = _traceparent()
        status, text = await _post(url, {**CHAT, "max_tokens": 50, "stream": True}, {**GOLD, "traceparent": header})
        assert status == 200 and b'"error"' in text
        spans = await traced.wait_request(trace_id)
    server = _check_tree(spans, parent)
    attrs = server.attributes or {}
    assert (attrs["http.response.status_code"], attrs["llmfleet.status"]) == (200, 502)
    assert attrs["error.type"] == "stream_broken" and server.status.status_code is StatusCode.ERROR
    streaming = _one(spans, "streaming")
    assert streaming.status.status_code is StatusCode.ERROR
    assert (streaming.attributes or {})["error.type"] == "stream_broken"
    assert _one(spans, "upstream").status.status_code is StatusCode.UNSET  # its first token came


async def test_a_quota_rejection_fails_the_quota_span_and_reaches_no_engine(shared_sim: Proc) -> None:
    traced = Traced()
    settings = settings_for([shared_sim.url], **{"tenants.0.requestsPerSecond": 1})
    async with serve(settings, session_factory=traced.session, tracer_provider=traced.provider) as (url, _):
        assert (await _post(url, CHAT, GOLD))[0] == 200
        header, trace_id, parent = _traceparent()
        assert (await _post(url, CHAT, {**GOLD, "traceparent": header}))[0] == 429
    spans = await traced.wait_request(trace_id)
    assert sorted(s.name for s in spans) == ["POST /v1/chat/completions", "auth", "quota"]
    quota = _one(spans, "quota")
    assert quota.status.status_code is StatusCode.ERROR
    assert (quota.attributes or {})["error.type"] == "QuotaExceeded"
    server = _check_tree(spans, parent)
    attrs = server.attributes or {}
    assert attrs["http.response.status_code"] == 429 and attrs["error.type"] == "QuotaExceeded"
    assert server.status.status_code is StatusCode.UNSET  # a 4xx is the client's: not a server span error
    assert len(traced.sent) == 1  # only the first request reached the engine


@pytest.mark.parametrize(
    ("client", "engine"),
    [
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        (None, None),
        ("00-not-a-trace-context", "00-not-a-trace-context"),
    ],
    ids=["callers-context-unchanged", "none-sent-none-forwarded", "anything-passed-as-it-came"],
)
async def test_with_tracing_off_the_engine_receives_the_callers_trace_context_as_it_came(
    shared_sim: Proc, client: str | None, engine: str | None
) -> None:
    traced = Traced()
    async with serve(settings_for([shared_sim.url]), session_factory=traced.session) as (url, _):
        headers = GOLD if client is None else {**GOLD, "traceparent": client, "tracestate": "vendor=1"}
        assert (await _post(url, CHAT, headers))[0] == 200
    (sent,) = traced.sent
    assert sent.get("traceparent") == engine
    assert sent.get("tracestate") == (None if engine is None else "vendor=1")
    assert traced.exporter.get_finished_spans() == ()


async def test_with_tracing_on_a_malformed_traceparent_starts_a_new_trace(traced_gateway: tuple[str, Traced]) -> None:
    url, traced = traced_gateway
    assert (await _post(url, CHAT, {**GOLD, "traceparent": "00-not-a-trace-context", "tracestate": "x=1"}))[0] == 200
    server = await async_wait_for(
        lambda: next((s for s in traced.exporter.get_finished_spans() if s.kind is SpanKind.SERVER), None),
        timeout_s=20,
        what="the server span",
    )
    assert server.parent is None and server.context is not None
    upstream = _one(traced.trace(f"{server.context.trace_id:032x}"), "upstream")
    (sent,) = traced.sent
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{server.context.trace_id:032x}", _span_id(upstream))
    assert int(flags, 16) & 1  # sampled (the SDK may add its random-trace-id flag)
    assert "tracestate" not in sent  # it belonged to the context that could not be read


# -- configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://otel-collector:4318", "http://otel-collector:4318/v1/traces"),
        ("http://otel-collector:4318/", "http://otel-collector:4318/v1/traces"),
        ("https://collector.example.com/v1/traces", "https://collector.example.com/v1/traces"),
    ],
)
def test_the_endpoint_is_a_collector_or_its_traces_url(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url


@pytest.mark.parametrize(
    ("tracing", "message"),
    [
        ({"otlpEndpoint": "otel-collector:4318"}, "llmfleet:gateway.tracing.otlpEndpoint: expected the http://"),
        ({"otlpEndpoint": "http://c:4318", "sampleRatio": 1.5}, "llmfleet:gateway.tracing.sampleRatio"),
        ({"otlpEndpoint": "http://c:4318", "exporter": "grpc"}, "llmfleet:gateway.tracing.exporter"),
    ],
    ids=["not-a-url", "ratio-over-one", "unknown-key"],
)
def test_a_bad_tracing_section_fails_at_load_naming_the_key(tracing: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        spec("gateway", **{"gateway.tracing": tracing})


def test_without_an_endpoint_there_is_no_provider_and_no_exporter_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert provider_for(spec("gateway").gateway.tracing) is None
    with pytest.raises(TracingUnavailable, match=r"llmfleet\[otlp\]"):
        provider_for(spec("gateway", **{"gateway.tracing.otlpEndpoint": "http://c:4318"}).gateway.tracing)


class Collector:
    """An OTLP/HTTP traces receiver on loopback: the spans it was sent, with their resource's service.name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service.name, span name)

    async def export(self, request: web.Request) -> web.Response:
        batch = ExportTraceServiceRequest.FromString(await request.read())
        for resource in batch.resource_spans:
            service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
            self.spans += [(service, span.name) for scope in resource.scope_spans for span in scope.spans]
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/v1/traces", self.export)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://127.0.0.1:{port}"


async def test_the_gateway_process_exports_spans_to_the_configured_collector(
    shared_sim: Proc, gateway_procs: Callable[..., Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = Collector()
    runner, endpoint = await collector.start()
    try:
        tracing = {"otlpEndpoint": endpoint, "serviceName": "gw-under-test"}
        stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **{"gateway.tracing": tracing})
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the batch leaves within 0.1 s, not 5 s
        gateway = gateway_procs(stack, [shared_sim.url])
        header, _, _ = _traceparent()
        assert (await _post(gateway.url, CHAT, {**GOLD, "traceparent": header}))[0] == 200
        await async_wait_for(
            lambda: ("gw-under-test", "POST /v1/chat/completions") in collector.spans,
            timeout_s=20,
            what="the request's server span at the collector",
            diagnostics=gateway.tail,
        )
    finally:
        await runner.cleanup()
    assert {name for _, name in collector.spans} >= {*PHASES, "POST /v1/chat/completions"}
