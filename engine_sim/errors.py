"""Errors of the engine simulator.

SimError
├── ConfigError        bad flags or a model that does not fit: the process exits before binding
└── RequestError       a request vLLM would reject; carries the HTTP status and OpenAI error fields
    ├── (400) BadRequestError      validation, prompt too long       not retryable
    ├── (404) NotFoundError        unknown model                     not retryable
    └── (500/503) ServiceError     engine dead or shutting down      retryable elsewhere
"""

from __future__ import annotations

from fleet.protocol.openai_error import error_dict

__all__ = ["ConfigError", "RequestError", "SimError"]


class SimError(Exception):
    """Base of the simulator's errors."""


class ConfigError(SimError):
    """Flags or model facts that make the engine impossible to start."""


class RequestError(SimError):
    """A rejected request, rendered as `fleet.protocol.openai_error` JSON with the HTTP status as ``code``."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _TYPES.get(status, "InternalServerError")
        self.param = param

    def to_json(self) -> dict[str, object]:
        return error_dict(self.message, self.type, self.status, self.param)


_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}
