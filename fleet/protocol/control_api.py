"""Control API: what the FastAPI control APIs (the control plane's and the agent's) share.

* JSON bodies are strict: ``NaN``, ``Infinity`` and numbers too large for a float are refused (400) at the edge,
  so no report can carry a non-finite number into the scaling arithmetic;
* every 4xx, whoever raises it (an unknown route, a wrong method, a body too large, an invalid body or query),
  is OpenAI's error JSON (`fleet.protocol.openai_error`): FastAPI's 422 becomes 400, with ``param`` naming the first
  offending field;
* the OpenAPI document (``/openapi.json``, browsable at ``/docs``) declares `OpenAIError` for those statuses
  instead of FastAPI's validation-error schema;
* request bodies are capped at `MAX_BODY_BYTES` (aiohttp's default, which these APIs had before);
* `ApiServer` serves an app with uvicorn inside the caller's event loop, on a socket the caller bound (so
  ``--port 0`` is known before serving), leaving the process's signals to the caller (SIGTERM drains an agent).

The data path (gateway, engine simulator) stays on aiohttp; see docs/architecture.md, "Choices".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet.protocol.openai_error import OpenAIError, error_dict

__all__ = ["MAX_BODY_BYTES", "ApiServer", "bind", "create_control_app", "error_response", "errors"]

MAX_BODY_BYTES = 1024**2

_TYPES = {404: "not_found_error", 409: "conflict_error"}

_DESCRIPTIONS = {
    400: "Invalid request: a malformed body or query parameter",
    401: "No or an invalid control credential (Authorization: Bearer <token>)",
    404: "Not found",
    409: "Conflict",
    503: "Unavailable",
}


def error_response(status: int, message: str, param: str | None = None, type_: str | None = None) -> JSONResponse:
    """An OpenAI error answer; ``type_`` defaults from the status (``not_found_error``, ``conflict_error``,
    ``invalid_request_error``)."""
    kind = type_ or _TYPES.get(status, "invalid_request_error")
    return JSONResponse(error_dict(message, kind, status, param), status_code=status)


def errors(*statuses: int, plain_text: bool = False) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: `OpenAIError` for each given status and for any other 4xx.

    ``plain_text``: the route answers text/plain when it succeeds (``/metrics``). FastAPI files a response
    model's schema under the route's media type, so there the JSON error is spelt out by reference (the schema
    is in the document through the app's JSON routes).
    """
    described: dict[int | str, str] = {status: _DESCRIPTIONS.get(status, "Error") for status in statuses}
    described["4XX"] = "A client error (unknown route, wrong method, body too large...)"
    if plain_text:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}
        return {status: {"description": text, "content": content} for status, text in described.items()}
    return {status: {"model": OpenAIError, "description": text} for status, text in described.items()}


class _NonFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def _constant(name: str) -> float:
    raise _NonFinite(name)


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, parse_float=_finite, parse_constant=_constant)
            except _NonFinite as exc:
                raise json.JSONDecodeError(f"{exc} is not a finite number", body.decode(errors="replace"), 0) from None
        return self._json


class _StrictJSONRoute(APIRoute):
    """Routes whose handlers read JSON through `_StrictJSONRequest` (FastAPI's documented custom-route hook)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def _location(loc: tuple[int | str, ...]) -> str | None:
    """The field a validation error is about (``body.pool`` -> ``pool``, ``query.limit`` -> ``limit``)."""
    names = [str(part) for part in loc[1:] if isinstance(part, str)]
    return ".".join(names) or None


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    del request  # Unused.
    assert isinstance(exc, RequestValidationError)
    problems = exc.errors()
    message = "; ".join(
        f"{_location(tuple(p['loc'])) or p['loc'][0]}: {p['msg']}"
        + (f" ({p['ctx']['error']})" if "error" in p.get("ctx", {}) else "")
        for p in problems
    )
    param = _location(tuple(problems[0]["loc"])) if problems else None
    return error_response(400, message or "invalid request", param)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    response = error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")
    if exc.headers:
        response.headers.update(exc.headers)  # e.g. Allow on a 405
    return response


class _BodyLimit:
    """A body over ``limit`` bytes (declared, or counted as it arrives) raises 413 where the app reads it, so the
    app's handler renders it (Starlette's own limiter answers in plain text)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        seen = int(declared) if declared.isdigit() else 0

        async def limited() -> Message:
            nonlocal seen
            if seen > self.limit:
                raise HTTPException(413, f"Content Too Large (over {self.limit} bytes)")
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"Content Too Large (over {self.limit} bytes)")
            return message

        await self.app(scope, limited, send)


def create_control_app(title: str, description: str) -> FastAPI:
    """An empty FastAPI app with the shared conventions; the caller adds its routes."""
    app = FastAPI(
        title=title,
        description=description,
        version="1",
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.router.route_class = _StrictJSONRoute  # before the caller adds its routes
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (0: a free port), not yet listening; OSError when taken."""
    # IPPROTO_TCP, not 0: asyncio disables Nagle's algorithm only on sockets that say they are TCP, and with it
    # on, each response (headers and body written apart) would wait ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn would replace the process's SIGINT/SIGTERM handlers while serving; the caller owns them.
        yield


class ApiServer:
    """uvicorn serving ``app`` on ``sock`` as a task of the running loop: `start` returns once it listens, `stop`
    closes the socket and its connections (in-flight requests get ``grace_s`` to finish)."""

    def __init__(self, app: FastAPI, sock: socket.socket, grace_s: int = 2) -> None:
        self.sock = sock
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,  # the process's logging configuration applies
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=grace_s,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]))
        while not self._server.started:  # uvicorn sets the flag, no event: its startup takes one loop turn
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the API server stopped while starting")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._task is None:
            self.sock.close()
            return
        self._server.should_exit = True
        await self._task
        self.sock.close()
