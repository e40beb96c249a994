"""Errors: every failure the gateway answers with, as OpenAI error JSON (`fleet.protocol.openai_error`) with the right
status.

    GatewayError                    status, OpenAI ``type`` and ``code``; ``retry_after`` adds Retry-After
      BadRequest                    400 bad JSON or parameters
      Unauthorized                  401 missing or unknown API key
      ModelNotAllowed               403 the tenant may not use this model
      ModelNotFound                 404 no pool serves this model
      RequestTimeout                408 the body did not arrive within timeouts.bodyReadS
      BodyTooLarge                  413 request body over gateway.maxBodyBytes
      UnsupportedMediaType          415 a body that is not declared application/json
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
      retryable = True:  UpstreamConnectError, UpstreamUnavailable (engine 503), UpstreamDiedEarly
                         (connection lost before the first byte reached the client)
      retryable = False: UpstreamTimeout, UpstreamStatus (any other non-2xx, relayed as is),
                         UpstreamBroken (failed after the first byte: ends the stream with an SSE error)

The retry loop branches on ``retryable`` (a class attribute), never on messages.
"""

from __future__ import annotations

from typing import ClassVar

from fleet.protocol.openai_error import error_body

__all__ = [
    "BadRequest",
    "BodyTooLarge",
    "UnsupportedMediaType",
    "GatewayError",
    "GatewayTimeout",
    "ModelNotAllowed",
    "ModelNotFound",
    "NoReadyReplica",
    "RequestTimeout",
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


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class ModelNotAllowed(GatewayError):
    status = 403
    type = "permission_error"


class ModelNotFound(GatewayError):
    status = 404
    type = "not_found_error"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"


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
    """The engine answered 503 (overloaded, draining or still loading)."""

    retryable = True
    replica_fault = False


class UpstreamDiedEarly(UpstreamError):
    """The connection broke before the first byte reached the client."""

    retryable = True


class UpstreamTimeout(UpstreamError):
    """No first token within timeouts.firstTokenS, or no end within timeouts.totalS."""


class UpstreamStatus(UpstreamError):
    """Any other non-2xx answer: relayed to the client unchanged (a 4xx is the caller's fault)."""

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
