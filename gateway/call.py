"""Call: one admitted request's inputs, fixed once its pool is known, with its Outcome and spans.

`Call` is what the attempts (`gateway.service`) and the stream relay (`gateway.streams`) read about the
request; every field is set once by `Call.of`. Its `Outcome` stays mutable: each phase writes its own part of it
(see `gateway.service`). Beside it, the request helpers that need no gateway state: the request id, the one
Authorization header, reading the body, and the headers an engine receives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
import uuid

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, DecompressSizeError
from aiohttp.web_protocol import RequestPayloadError

from fleet.spec.stack import PoolSpec, TenantSpec
from gateway.auth import FORWARDED_HEADERS
from gateway.body import PATHS, ParsedRequest
from gateway.errors import BadEncoding, BodyTooLarge, BrokenBody, MalformedHeader, RequestTimeout
from gateway.outcome import Outcome
from gateway.response_ids import Held
from gateway.routing.base import RequestInfo
from gateway.tracing import RequestSpans

__all__ = ["REQUEST_ID", "Call", "authorization", "new_request_id", "read_body", "request_id_for"]

REQUEST_ID = web.RequestKey("request_id", str)
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclasses.dataclass(frozen=True, eq=False)
class Call:
    """One request on its way to a pool's engines."""

    request: web.Request
    tenant: TenantSpec
    parsed: ParsedRequest
    pool: PoolSpec
    info: RequestInfo  # the request as the pool's router sees it
    body: bytes  # what each engine receives (the served name or adapter as its model)
    headers: dict[str, str]  # what each engine receives, before the trace context (never changed)
    path: str  # the engine's endpoint for the request's kind
    out: Outcome
    spans: RequestSpans
    held: Held | None = None  # a Responses follow-up: where its previous response lives (only that replica serves it)

    @classmethod
    def of(
        cls,
        request: web.Request,
        tenant: TenantSpec,
        parsed: ParsedRequest,
        pool: PoolSpec,
        info: RequestInfo,
        engine_api_key: str | None,
        out: Outcome,
        spans: RequestSpans,
        held: Held | None = None,
    ) -> Call:
        """The call for ``pool``, ``info`` being the request as routed from now on (its model the served name, its
        ``cache_salt`` the engine's); ``held``: the previous response of a follow-up, named to the engine by the
        engine's own id."""
        return cls(
            request=request,
            tenant=tenant,
            parsed=parsed,
            pool=pool,
            info=info,
            body=parsed.upstream_body(
                out.adapter or pool.served_name, held.engine_id if held else None, info.cache_salt
            ),
            headers=upstream_headers(request, out.request_id, engine_api_key),
            path=PATHS[parsed.kind],
            out=out,
            spans=spans,
            held=held,
        )

    def used_tokens(self) -> int:
        """The tokens the quota settles: the engine's counts, the parsed prompt's when the engine gave none. A
        background response is charged its whole reservation: it runs on after its answer, unseen."""
        if self.parsed.kind == "response" and self.parsed.payload.get("background") is True:
            if self.out.completion_tokens is None:
                return self.parsed.reserve_tokens
        prompt = self.out.prompt_tokens
        return (prompt if prompt is not None else self.parsed.prompt_tokens) + (self.out.completion_tokens or 0)


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id_for(sent: str | None) -> str:
    """The request's id: the client's ``x-request-id`` when it sent a sane one, else a new one."""
    return sent if sent and _SANE_REQUEST_ID.match(sent) else new_request_id()


def authorization(request: web.Request) -> str | None:
    """The one Authorization header; MalformedHeader, before any work, when it is repeated or not ASCII (a client
    cannot mean two keys, and a key is never anything but ASCII). `gateway.edge.header_guard` refuses such a
    header before any route runs; this check keeps a route correct without it."""
    values = request.headers.getall("Authorization", [])
    if len(values) > 1:
        raise MalformedHeader("more than one Authorization header", param="Authorization")
    if values and not values[0].isascii():
        raise MalformedHeader("malformed Authorization header: not ASCII", param="Authorization")
    return values[0] if values else None


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body: BodyTooLarge over ``limit`` bytes, RequestTimeout when it takes over ``timeout_s``,
    BadEncoding when it does not match its Content-Encoding, BrokenBody when its framing is broken."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds {limit}")
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"request body exceeds {limit} bytes") from None
    except RequestPayloadError as exc:
        if isinstance(exc.__cause__, ContentEncodingError | DecompressSizeError):
            raise BadEncoding("the request body cannot be read: it does not match its Content-Encoding") from None
        raise BrokenBody("the request body cannot be read: its framing is broken or cut short") from None
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g}s") from None


def upstream_headers(request: web.Request, request_id: str, engine_api_key: str | None) -> dict[str, str]:
    """The headers each engine receives: the request id, the gateway's engine key, the forwarded client ones.

    vLLM takes ``X-Request-Id`` as the base of its own request id, so the engine gets the request's id with a
    suffix the gateway draws: a client's id (it may send one) still prefixes the engine's for tracing, but cannot
    name another request's, another tenant's included, on the engine."""
    headers = {"Content-Type": "application/json", "x-request-id": f"{request_id}-{secrets.token_hex(4)}"}
    if engine_api_key:  # engines refuse anyone else: the gateway is the only way in
        headers["Authorization"] = f"Bearer {engine_api_key}"
    for name in FORWARDED_HEADERS[1:]:
        value = request.headers.get(name)
        if value is not None:
            headers[name] = value
    return headers
