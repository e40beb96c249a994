"""Errors: every failure the gateway answers with, as OpenAI error JSON (`fleet.protocol.openai_error`) with the right
status.

    GatewayError                    status, OpenAI ``type`` and ``code``; ``retry_after`` adds Retry-After
      BadRequest                    400 bad parameters
        MalformedHeader             a header the gateway reads is repeated or not ASCII   (client error: header)
        MalformedTarget             the request target's percent-encoding is broken        (client error: url)
        UndecodableBody             the body is not UTF-8 JSON, or nested too deeply       (client error: body)
        BadEncoding                 the body does not match its Content-Encoding           (encoding; closes)
        BrokenBody                  the body's framing is broken or cut short              (body; closes)
      Unauthorized                  401 missing or unknown API key
      ModelNotAllowed               403 the tenant may not use this model
      ModelNotFound                 404 no pool serves this model
      ResponseNotFound              404 a response id this tenant was not given, or whose replica has left
      RequestTimeout                408 the body did not arrive within timeouts.bodyReadS (client error: body_timeout;
                                    closes)
      BodyTooLarge                  413 request body over gateway.maxBodyBytes
      UnsupportedMediaType          415 a body that is not declared application/json
        UnsupportedEncoding         a Content-Encoding other than gzip, deflate or identity (client error: encoding)
      TooManyRequests               429 (Retry-After)
        QuotaExceeded               tenant over requests/s, tokens/min or concurrency
        QueueFull                   admission queue full, or evicted by a higher-priority request
      ServiceUnavailable            503 (Retry-After)
        NoReadyReplica              the model's pool has no ready replica (also when scaled to zero)
        QueueTimeout                waited in the admission queue past queue.timeoutS
        QuotaStoreUnavailable       the shared quota store (Redis) cannot be reached
      GatewayTimeout                504 first token or total time exceeded
      UpstreamFailed                502 an engine failed in a way that is not retried

    UpstreamError                   raised by the proxy about one attempt on one replica
      retryable = True:  UpstreamConnectError, UpstreamUnavailable (engine 503 or abort; its subclass
                         UpstreamDraining: vLLM's 500 "cannot schedule new futures after shutdown"),
                         UpstreamDiedEarly (connection lost before the first byte reached the client)
      retryable = False: UpstreamTimeout, UpstreamStatus (any other non-2xx, a plain 500 included, relayed as is),
                         UpstreamBroken (failed after the first byte: ends the stream with an SSE error)

The retry loop branches on ``retryable`` (a class attribute), never on messages. Likewise ``client_kind`` marks the
errors that are a client's malformed or abandoned input: the middleware that answers them counts each in
``llmfleet_gateway_client_errors_total{kind}`` and logs it on one line (`GatewayMetrics.client_error`); ``closes``
marks those after which the connection is closed at once (the rest of the body is stalled or undecodable: nothing
is gained by reading it).
"""

from __future__ import annotations

from typing import ClassVar

from fleet.protocol.openai_error import error_body

__all__ = [
    "BadEncoding",
    "BadRequest",
    "BodyTooLarge",
    "BrokenBody",
    "MalformedHeader",
    "MalformedTarget",
    "UndecodableBody",
    "UnsupportedEncoding",
    "UnsupportedMediaType",
    "GatewayError",
    "GatewayTimeout",
    "ModelNotAllowed",
    "ModelNotFound",
    "NoReadyReplica",
    "RequestTimeout",
    "ResponseNotFound",
    "QueueFull",
    "QueueTimeout",
    "QuotaStoreUnavailable",
    "QuotaExceeded",
    "ServiceUnavailable",
    "TooManyRequests",
    "Unauthorized",
    "UpstreamBroken",
    "UpstreamConnectError",
    "UpstreamDiedEarly",
    "UpstreamDraining",
    "UpstreamError",
    "UpstreamFailed",
    "UpstreamStatus",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]


class GatewayError(Exception):
    """An error answered to the client. Subclasses fix ``status`` and ``type``."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    client_kind: ClassVar[str | None] = None  # the client_errors_total kind, for a client's malformed input
    closes: ClassVar[bool] = False  # the connection closes after the answer

    def __init__(self, message: str, *, param: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def code(self) -> str:
        return self.__class__.__name__

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.status, self.param)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, int(self.retry_after + 0.999)))}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class MalformedHeader(BadRequest):
    client_kind = "header"


class MalformedTarget(BadRequest):
    client_kind = "url"


class UndecodableBody(BadRequest):
    client_kind = "body"


class BadEncoding(BadRequest):
    client_kind = "encoding"
    closes = True


class BrokenBody(BadRequest):
    client_kind = "body"
    closes = True


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class ModelNotAllowed(GatewayError):
    status = 403
    type = "permission_error"


class ModelNotFound(GatewayError):
    status = 404
    type = "not_found_error"


class ResponseNotFound(GatewayError):
    """A response id this tenant was not given, or whose replica has left (as vLLM words its own 404)."""

    status = 404
    type = "invalid_request_error"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    client_kind = "body_timeout"
    closes = True


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"


class UnsupportedEncoding(UnsupportedMediaType):
    client_kind = "encoding"


class TooManyRequests(GatewayError):
    status = 429
    type = "rate_limit_error"


class QuotaExceeded(TooManyRequests):
    pass


class QueueFull(TooManyRequests):
    pass


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"


class NoReadyReplica(ServiceUnavailable):
    pass


class QuotaStoreUnavailable(ServiceUnavailable):
    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=1.0)


class QueueTimeout(ServiceUnavailable):
    pass


class GatewayTimeout(GatewayError):
    status = 504
    type = "timeout"


class UpstreamFailed(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamError(Exception):
    """One failed attempt on one replica; ``retryable`` says whether another replica may try."""

    retryable: ClassVar[bool] = False
    # Whether the replica itself is to blame (counts towards outlier ejection).
    replica_fault: ClassVar[bool] = True


class UpstreamConnectError(UpstreamError):
    retryable = True


class UpstreamUnavailable(UpstreamError):
    """The engine answered 503 (overloaded, draining or still loading), or ended a non-streamed request with
    ``finish_reason: "abort"`` (it is shutting down)."""

    retryable = True
    replica_fault = False


class UpstreamDraining(UpstreamUnavailable):
    """The engine answered HTTP 500 ``cannot schedule new futures after shutdown``: it is draining, and refused the
    request before accepting it.

    vLLM 0.32 stopping with ``--shutdown-timeout`` > 0 shuts down its renderer's thread pool first, so every request
    that arrives during the drain fails at once with that 500 (an ``InternalServerError`` raised by Python's
    executor), while ``/health`` stays 200 and the streams in flight run to their end
    (shared/research/real_vllm/REPORT.md, "SIGTERM"). Nothing was generated and nothing reached the client: a
    refusal, like a draining engine's 503, so it is retried on another replica, the replica leaves rotation until
    its next good probe, and it is no fault of the replica (no ejection).
    """


class UpstreamDiedEarly(UpstreamError):
    """The connection broke before the first byte reached the client."""

    retryable = True


class UpstreamTimeout(UpstreamError):
    """No first token within timeouts.firstTokenS, or no end within timeouts.totalS."""


class UpstreamStatus(UpstreamError):
    """Any other non-2xx answer: relayed to the client unchanged (a 4xx is the caller's fault).

    A plain 500 (not `UpstreamDraining`'s) is relayed too, not retried, and counted as a replica fault: vLLM answers
    500 for an error raised while handling this request (rendering it, or an engine that died, whose process then
    exits and whose later requests fail to connect, which is retried). A request that breaks one replica's
    handling would most often break every replica's, so retrying would multiply its cost and, by hiding the 5xx,
    the canary analysis and the availability SLO (both read the gateway's 5xx per pool) would miss a failing pool;
    a replica that keeps failing is ejected after 3 faults in a row instead (`gateway.endpoints.OutlierPolicy`).
    """

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type

    @property
    def replica_fault(self) -> bool:  # type: ignore[override]
        return self.status >= 500


class UpstreamBroken(UpstreamError):
    """A failure after the first byte was sent to the client: the stream ends with an SSE error event."""
