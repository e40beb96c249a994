"""Edge: what reaches the gateway before its routes do, answered as OpenAI error JSON, counted, and logged on one line.

    header_guard(*extra_headers) -> middleware   refuses, before any route runs, a header the gateway reads that
                                                 is repeated where it must be single or is not ASCII, a
                                                 Content-Encoding other than gzip, deflate or identity, and a
                                                 request target whose percent-encoding is broken
    error_response(request, exc, request_id)     a `GatewayError` as the client reads it; counts a client error
    EdgeRunner(app, timeouts, **kw)              `web.AppRunner` whose connections enforce the limits below
    EdgeRunner.close_idle(before)                closes the connections idle since ``before`` (`gateway.drain`)

Both listeners run under an `EdgeRunner` (`gateway.cli`), whose connections are aiohttp's with two changes:

* **aiohttp's own refusals** (a request it cannot parse: a header line or request line over ``MAX_LINE_BYTES``,
  more than ``MAX_HEADERS`` headers, a repeated Content-Length or Content-Type, control characters, broken chunk
  framing, a malformed request target, an encoding it cannot decode) are answered as OpenAI error JSON with a 4xx
  (431 for a line over the limit, 415 for an encoding, else 400) instead of aiohttp's plain text, counted in
  ``llmfleet_gateway_client_errors_total{kind}`` and logged on one line, without the traceback aiohttp logs;
* **a body left unread** and broken (an early answer to a request whose gzip body is corrupt) is counted and logged
  the same way when aiohttp drains it, instead of an "Unhandled exception" with its traceback.

Timeouts (``gateway.timeouts``), every one measured from the connection's first byte or the end of its previous
answer, whichever came last:

* ``headerReadS``: a connection whose request line and headers have not all arrived is closed (aiohttp's keep-alive
  timer: it starts when the connection opens or an answer ends and is not reset by bytes arriving, so a client
  sending one byte a second is cut off as surely as a silent one);
* ``bodyReadS``: a body the route reads that has not all arrived is answered 408 and the connection closed
  (`gateway.call.read_body`); a body no route reads (a GET's, an early 401's) is read and dropped for at most
  ``bodyReadS`` (aiohttp's lingering time) before the connection closes.

A 500 (a fault of the gateway's own) keeps its traceback in the log.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import hdrs, web
from aiohttp.http_exceptions import (
    ContentEncodingError,
    DecompressSizeError,
    HttpProcessingError,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDictProxy

from fleet.protocol.openai_error import error_body
from fleet.spec.gateway import TimeoutSpec
from gateway.call import new_request_id
from gateway.dialects import error_body_for
from gateway.errors import GatewayError, MalformedHeader, MalformedTarget, UnsupportedEncoding
from gateway.metrics import GatewayMetrics

__all__ = [
    "ENCODINGS",
    "MAX_FIELD_BYTES",
    "MAX_HEADERS",
    "MAX_LINE_BYTES",
    "METRICS",
    "EdgeRunner",
    "check_headers",
    "check_target",
    "error_response",
    "header_guard",
]

# aiohttp's own defaults, stated: a request line (method, target, version) and each header line at most 8190 bytes,
# at most 128 headers. A key, a request id or a trace context is a few hundred bytes at most.
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 128
ENCODINGS = frozenset({"gzip", "deflate", "identity"})  # the request body encodings the gateway decodes

# The headers the gateway reads, and those of them a client cannot mean twice (tracestate may be split in several).
_SINGLE = (hdrs.AUTHORIZATION, hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH, hdrs.CONTENT_ENCODING, "x-request-id")
_READ = (*_SINGLE, hdrs.TRANSFER_ENCODING, "traceparent", "tracestate")

_BROKEN_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")

METRICS = web.AppKey("edge_metrics", GatewayMetrics)  # set on both applications once the gateway is built

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def check_headers(headers: CIMultiDictProxy[str], single: tuple[str, ...] = ()) -> None:
    """MalformedHeader when a header the gateway reads (``single`` adds some, e.g. the session header) is repeated
    where it must be single or holds anything but ASCII; UnsupportedEncoding for a Content-Encoding outside
    `ENCODINGS` (aiohttp would pass an unknown one through undecoded)."""
    must_be_single = (*_SINGLE, "traceparent", *single)
    for name in (*_READ, *single):
        values = headers.getall(name, [])
        if len(values) > 1 and name in must_be_single:
            raise MalformedHeader(f"more than one {name} header", param=name)
        if any(not value.isascii() for value in values):  # aiohttp hands bytes that are not UTF-8 on as surrogates
            raise MalformedHeader(f"malformed {name} header: not ASCII", param=name)
    encoding = headers.get(hdrs.CONTENT_ENCODING)
    if encoding is not None and encoding.strip().lower() not in ENCODINGS:
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported: send {', '.join(sorted(ENCODINGS))}",
            param=hdrs.CONTENT_ENCODING,
        )


def check_target(raw_path: str) -> None:
    """MalformedTarget when the request target's percent-encoding is broken (a ``%`` without two hex digits) or
    does not decode to UTF-8: aiohttp would route it as it came, to a 404 that hides the client's mistake."""
    if _BROKEN_ESCAPE.search(raw_path):
        raise MalformedTarget("malformed request target: a '%' not followed by two hex digits")
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedTarget("malformed request target: its percent-encoding does not decode to UTF-8") from None


def header_guard(*single: str) -> Middleware:
    """The middleware that runs `check_target` and `check_headers` (``single``: the extra headers read, each
    single) before the route, or the 404 or 405 that stands for it."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        check_target(request.raw_path)
        check_headers(request.headers, single)
        return await handler(request)

    return guard


async def error_response(request: web.Request, exc: GatewayError, request_id: str) -> web.StreamResponse:
    """``exc`` as OpenAI error JSON with ``x-request-id``; a client error (``client_kind``) is counted and logged on
    one line. One that ``closes`` is sent here and the connection closed at once, rather than after aiohttp has
    spent its lingering time reading a body that is stalled or undecodable."""
    response = web.Response(status=exc.status, body=error_body_for(request.path, exc), content_type="application/json")
    response.headers.update(exc.headers())
    response.headers["x-request-id"] = request_id
    if exc.client_kind is not None:
        metrics = request.app.get(METRICS)
        if metrics is not None:
            metrics.client_error(exc.client_kind, f"{request.method} {request.path}: {exc.message}", request.remote)
    if exc.closes:
        response.force_close()  # Connection: close
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()  # the transport closes once the answer is written
    return response


def _refusal(exc: HttpProcessingError) -> tuple[str, int, str]:
    """(client error kind, status, message) for a request aiohttp refused to parse."""
    if isinstance(exc, LineTooLong):
        return "too_large", 431, f"a request line or header line over {MAX_LINE_BYTES} bytes"
    if isinstance(exc, InvalidURLError):
        return "url", 400, "malformed request target"
    if isinstance(exc, ContentEncodingError | DecompressSizeError):
        return "encoding", 415, f"the body's Content-Encoding cannot be decoded: send {', '.join(sorted(ENCODINGS))}"
    if isinstance(exc, PayloadEncodingError):
        return "body", 400, "malformed request body framing"
    return "malformed", 400, f"malformed HTTP request: {exc.message}"[:300]


def _unread_body_fault(exc: object) -> str | None:
    """The client error kind of an exception aiohttp met while dropping a body no route read; None: not a client's."""
    if isinstance(exc, RequestPayloadError):
        return "encoding" if isinstance(exc.__cause__, ContentEncodingError | DecompressSizeError) else "body"
    if isinstance(exc, HttpProcessingError):
        return _refusal(exc)[0]
    if isinstance(exc, ConnectionError):
        return "disconnect"
    return None


class _EdgeHandler(RequestHandler):
    """aiohttp's connection handler, its refusals answered as OpenAI error JSON and counted (module docstring)."""

    def __init__(self, manager: web.Server, metrics: GatewayMetrics, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._edge_metrics = metrics
        self.last_active = self._loop.time()  # when it last read a byte or finished an answer (`close_if_idle`)

    def data_received(self, data: bytes) -> None:
        self.last_active = self._loop.time()
        super().data_received(data)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self.last_active = self._loop.time()

    def close_if_idle(self, before: float) -> None:
        """Close the connection if aiohttp waits for its next request (its own test before a keep-alive close) and
        it has read nothing and answered nothing since ``before`` (loop time): a request being written into it is
        then read and answered, not cut (`gateway.drain`)."""
        if self._waiter is not None and not self._waiter.done() and self.last_active < before:
            self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: part of an answer went out, no other can follow
            raise ConnectionError("the response had begun: no error response can follow")
        if isinstance(exc, ConnectionError):  # the client went away (counted where it was met): nothing to answer
            raise exc
        if isinstance(exc, HttpProcessingError):
            kind, status, text = _refusal(exc)
            self._edge_metrics.client_error(kind, exc.message or text, request.remote)
            body = error_body(text, "invalid_request_error", status)
        else:  # the gateway's own fault (an unhandled exception, a timeout): the traceback stays
            super().log_exception("Error handling request from %s", request.remote, exc_info=exc)
            body = error_body(HTTPStatus(status).phrase, "internal_error" if status == 500 else "timeout", status)
        response = web.Response(status=status, body=body, content_type="application/json")
        response.headers["x-request-id"] = new_request_id()
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        kind = _unread_body_fault(exc)
        if kind is None:
            super().log_exception(*args, **kw)
            return
        self._edge_metrics.client_error(kind, f"unread request body: {type(exc).__name__}: {exc}", None)


class _EdgeServer(web.Server):
    """`web.Server` building `_EdgeHandler` connections (aiohttp takes no handler class as an option)."""

    def __init__(self, made: web.Server, metrics: GatewayMetrics) -> None:
        kwargs = dict(made._kwargs)  # the connection options the runner gave the server it made
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **kwargs,
        )
        self._edge_metrics = metrics

    def __call__(self) -> RequestHandler:
        return _EdgeHandler(self, self._edge_metrics, loop=self._loop, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """`web.AppRunner` for one listener: keep-alive and header timeout ``timeouts.headerReadS``, unread bodies
    dropped for at most ``timeouts.bodyReadS``, the module's line and header limits, and `_EdgeHandler`
    connections. ``app[METRICS]`` must be set once the application has started."""

    def __init__(self, app: web.Application, timeouts: TimeoutSpec, **kwargs: Any) -> None:
        super().__init__(
            app,
            keepalive_timeout=timeouts.header_read_s,
            lingering_time=timeouts.body_read_s,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
            **kwargs,
        )

    def close_idle(self, before: float) -> int:
        """Close each connection idle since ``before`` (`_EdgeHandler.close_if_idle`); how many are left open."""
        connections = [] if self.server is None else list(self.server.connections)
        for connection in connections:
            if isinstance(connection, _EdgeHandler):
                connection.close_if_idle(before)
        return 0 if self.server is None else len(self.server.connections)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts the application: its gateway and metrics exist from here on
        return _EdgeServer(made, self.app[METRICS])
