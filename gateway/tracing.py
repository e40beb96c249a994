"""Tracing: OpenTelemetry spans for each phase of a request, and the trace context each engine receives.

One trace per request, a child of the caller's ``traceparent`` (W3C trace context) when it sent one:

    POST /v1/chat/completions   SERVER    the whole request: status, error type, tenant, model, pool, tokens
      auth                      INTERNAL  the API key -> tenant
      quota                     INTERNAL  the tenant's quota reservation
      queued                    INTERNAL  the wait for an admission slot
      route                     INTERNAL  one routing decision: the replica and the picker that chose it
      upstream                  CLIENT    one attempt on one replica, from sending until the first token (the
                                          whole answer when not streamed): retries and resumes add one each
      streaming                 INTERNAL  a stream from its first token to its last

Attribute names follow OpenTelemetry's semantic conventions where one exists (``http.*``, ``server.*``,
``error.type``, ``gen_ai.*``), else ``llmfleet.*``. A phase that rejects the request (401 in auth, 429 in quota)
ends with status ERROR and ``error.type``; the server span keeps the HTTP rule: ERROR for 5xx only. Each upstream
attempt sends the engine a ``traceparent`` naming its upstream span, so an engine's own spans join the trace.

`Tracing` takes an injected ``TracerProvider`` and sets no global one. Without a provider every request gets
`UNTRACED`, whose calls return at once (cheaper than OpenTelemetry's no-op tracer, which still parses and copies
contexts), and the engine receives the caller's trace context as it came. A provider's unsampled requests skip
every attribute (`Span.is_recording`). `provider_for` builds the exporting provider from ``gateway.tracing``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    from fleet.spec.stack import GatewayTracingSpec
    from gateway.outcome import Outcome

__all__ = ["UNTRACED", "RequestSpans", "Tracing", "TracingUnavailable", "fail", "provider_for", "traces_url"]

_TRACER = "llmfleet.gateway"
# gen_ai.operation.name: OpenAI's Responses and Anthropic's Messages are chat operations in the GenAI conventions
_OPERATION = {
    "chat": "chat",
    "completion": "text_completion",
    "embedding": "embeddings",
    "response": "chat",
    "message": "chat",
}
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_PROPAGATOR = TraceContextTextMapPropagator()  # stateless: W3C traceparent/tracestate only, never the global one


class TracingUnavailable(RuntimeError):
    """``gateway.tracing.otlpEndpoint`` is set but the OTLP exporter (the ``otlp`` extra) is not installed."""


class Tracing:
    """The gateway's tracer. ``provider`` None: tracing off, and `start` hands out `UNTRACED`."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.tracer = provider.get_tracer(_TRACER) if provider is not None else None

    def start(self, method: str, route: str, kind: str, headers: Mapping[str, str], request_id: str) -> RequestSpans:
        """Open the server span of one request, parented by the trace context in the client's ``headers``."""
        if self.tracer is None:
            return UNTRACED
        parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else None
        span = self.tracer.start_span(f"{method} {route}", context=parent, kind=SpanKind.SERVER)
        if span.is_recording():
            span.set_attributes(
                {
                    "http.request.method": method,
                    "http.route": route,
                    "gen_ai.operation.name": _OPERATION.get(kind, kind),
                    "llmfleet.request_id": request_id,
                }
            )
        return RequestSpans(self.tracer, span)


class RequestSpans:
    """The spans of one request; `finish` ends the server span (once, after every phase ended)."""

    def __init__(self, tracer: trace.Tracer, server: Span) -> None:
        self._tracer = tracer
        self.server = server
        self._context: Context = trace.set_span_in_context(server)

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        """Set attributes on the server span (None values are left out)."""
        _set(self.server, attributes)

    def phase(
        self, name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL
    ) -> contextlib.AbstractContextManager[Span]:
        """A child span of the server span around the block; an exception escaping it marks the span failed."""
        return self._phase(name, attributes, kind)

    @contextlib.contextmanager
    def _phase(self, name: str, attributes: Mapping[str, Any] | None, kind: SpanKind) -> Iterator[Span]:
        span = self._tracer.start_span(name, context=self._context, kind=kind)
        if attributes:
            _set(span, attributes)
        try:
            yield span
        except BaseException as exc:
            fail(span, exc)
            raise
        finally:
            span.end()

    def upstream(
        self, replica: str, pool: str, url: str, attempt: int, retry_reason: str | None
    ) -> contextlib.AbstractContextManager[Span]:
        """The `phase` of one attempt on one replica (CLIENT kind), until its first token; send `headers_for` the
        span it yields. The proxy raises for any answer but 200, so a block that ends normally records 200."""
        return self._upstream(replica, pool, url, attempt, retry_reason)

    @contextlib.contextmanager
    def _upstream(self, replica: str, pool: str, url: str, attempt: int, retry_reason: str | None) -> Iterator[Span]:
        attributes: dict[str, Any] = {}
        if self.server.is_recording():  # children share their server span's sampling decision
            engine = urlsplit(url)
            attributes = {
                "llmfleet.replica": replica,
                "llmfleet.pool": pool,
                "llmfleet.attempt": attempt,
                "llmfleet.retry.reason": retry_reason,
                "http.request.method": "POST",
                "server.address": engine.hostname,
                "server.port": engine.port,
            }
        with self._phase("upstream", attributes, SpanKind.CLIENT) as span:
            yield span
            span.set_attribute("http.response.status_code", 200)

    def begin(self, name: str, attributes: Mapping[str, Any]) -> Span:
        """A child span of the server span for a phase that does not fit one block; the caller ends it."""
        span = self._tracer.start_span(name, context=self._context)
        _set(span, attributes)
        return span

    def headers_for(self, span: Span, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with the ``traceparent`` (and ``tracestate``) naming ``span`` in place of the client's: what
        one attempt sends. A client's malformed trace context is not passed on."""
        out = {name: value for name, value in headers.items() if name not in _TRACE_HEADERS}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(span))
        return out

    def end(self, span: Span, error: str | None, attributes: Mapping[str, Any]) -> None:
        """End a span from `begin` with ``attributes``; ``error`` (an ``error.type``) marks it failed."""
        _set(span, {**attributes, "error.type": error})
        if error is not None and span.is_recording():
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def finish(self, out: Outcome) -> None:
        """End the server span with what the request came to."""
        span = self.server
        if span.is_recording():
            # A stream that failed after its 200 headers is recorded as 502 (`gateway.streams`), yet sent 200.
            sent = 200 if out.stream_status is not None else out.status
            _set(
                span,
                {
                    "http.response.status_code": sent or None,
                    "llmfleet.status": out.status,
                    "error.type": out.error,
                    "llmfleet.tenant": out.tenant,
                    "gen_ai.request.model": out.model,
                    "gen_ai.request.stream": out.stream,
                    "gen_ai.usage.input_tokens": out.prompt_tokens,
                    "gen_ai.usage.output_tokens": out.completion_tokens,
                    "llmfleet.replica": out.replica,
                    "llmfleet.attempts": out.attempts,
                    "llmfleet.retries": max(0, out.attempts - 1 - out.resumes),
                    "llmfleet.resumes": out.resumes,
                },
            )
            if out.status >= 500:
                span.set_status(Status(StatusCode.ERROR, out.error))
        span.end()


class _Untraced(RequestSpans):
    """Tracing off: every call returns at once (no span, no context, no parsing), and each attempt sends the
    client's own ``traceparent``/``tracestate`` on as they came. Stateless: one instance serves every request."""

    def __init__(self) -> None:
        super().__init__(trace.NoOpTracer(), trace.INVALID_SPAN)
        self._none = contextlib.nullcontext(trace.INVALID_SPAN)  # reusable: it holds no state

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        del attributes  # Unused.

    def phase(
        self, name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL
    ) -> contextlib.AbstractContextManager[Span]:
        del name, attributes, kind  # Unused.
        return self._none

    def upstream(
        self, replica: str, pool: str, url: str, attempt: int, retry_reason: str | None
    ) -> contextlib.AbstractContextManager[Span]:
        del replica, pool, url, attempt, retry_reason  # Unused.
        return self._none

    def begin(self, name: str, attributes: Mapping[str, Any]) -> Span:
        del name, attributes  # Unused.
        return trace.INVALID_SPAN

    def headers_for(self, span: Span, headers: dict[str, str]) -> dict[str, str]:
        del span  # Unused.
        return headers

    def end(self, span: Span, error: str | None, attributes: Mapping[str, Any]) -> None:
        del span, error, attributes  # Unused.

    def finish(self, out: Outcome) -> None:
        del out  # Unused.


UNTRACED: RequestSpans = _Untraced()


def fail(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: ``error.type`` is the error's class (`GatewayError` code), status ERROR."""
    if not span.is_recording():
        return
    span.set_attribute("error.type", exc.code if isinstance(exc, GatewayError) else type(exc).__name__)
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        span.set_attribute("http.response.status_code", status)
    span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))


def _set(span: Span, attributes: Mapping[str, Any]) -> None:
    if span.is_recording():
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``gateway.tracing.otlpEndpoint``: as given when it ends with ``/v1/traces``,
    else the collector's base URL with ``/v1/traces`` added (as ``OTEL_EXPORTER_OTLP_ENDPOINT`` works)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def provider_for(spec: GatewayTracingSpec) -> SdkTracerProvider | None:
    """The exporting provider ``gateway.tracing`` asks for: None without an endpoint (tracing off), else an SDK
    provider sampling ``sampleRatio`` of new traces (a caller's sampled flag decides for its own), batching spans
    to the OTLP/HTTP exporter. `TracingUnavailable` when that exporter is not installed."""
    if spec.otlp_endpoint is None:
        return None
    try:  # the exporter is an optional extra: imported only when an endpoint is set
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise TracingUnavailable(
            "gateway.tracing.otlpEndpoint is set but the OTLP exporter is not installed: "
            "pip install 'llmfleet[otlp]' (opentelemetry-exporter-otlp-proto-http)"
        ) from exc
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = SdkProvider(
        sampler=ParentBased(TraceIdRatioBased(spec.sample_ratio)),
        resource=Resource.create({"service.name": spec.service_name}),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(spec.otlp_endpoint))))
    return provider
