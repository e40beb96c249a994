"""Edge: every route of both listeners of a gateway process answers a malformed header with a 4xx in OpenAI's
error shape before any work, and an unknown path or method with a 404 or 405 in the same shape.

The routes come from the applications' routers (`create_app`, `create_admin_app`), so a route added later is sent
every case too. Requests are written on a raw socket: aiohttp's client refuses to send most of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from gateway.app import create_admin_app, create_app
from gateway.edge import MAX_FIELD_BYTES, MAX_HEADERS, MAX_LINE_BYTES
from tests.gateway.conftest import admin_url, settings_for, sim_args
from tests.support.procs import Proc, Procs
from tests.support.raw_http import Header, exchange, request
from tests.support.stacks import KEYS, MODEL, write_stack

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
KEY = f"Bearer {KEYS['gold']}".encode()


@dataclass(frozen=True)
class Listener:
    url: str
    routes: list[tuple[str, str]]  # (method, path) of every route, a concrete path for a dynamic one


@dataclass(frozen=True)
class Gateway:
    proc: Proc
    public: Listener
    admin: Listener


def _routes(app: web.Application) -> list[tuple[str, str]]:
    """Every (method, path) ``app`` routes (``*`` for any method), ``{name}`` parts filled in."""
    found = []
    for route in app.router.routes():
        assert route.resource is not None, route
        found.append((route.method, re.sub(r"\{[^}]+\}", "anything", route.resource.canonical)))
    return found


def _sent(method: str) -> list[str]:
    """The methods a case is sent with for a route of ``method``: any route takes GET and POST."""
    return ["GET", "POST"] if method == "*" else [method]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("edge")
    procs = Procs(folder)
    try:
        sim = procs.start(sim_args(), name="sim")
        sim.wait_url("API server")
        stack = write_stack(folder / "Pulumi.edge.yaml", "gateway")
        proc = procs.start(["gateway", "--stack", str(stack), "--port", "0", "--replica", sim.url], name="gateway")
        proc.wait_url("listening on")
        app = create_app(settings_for([sim.url]))  # built, not started: its router is all that is read
        public = Listener(proc.url, _routes(app))
        admin = Listener(admin_url(proc), _routes(create_admin_app(app)))
        yield Gateway(proc, public, admin)
    finally:
        procs.close()


def _valid(method: str) -> list[Header]:
    """The headers of a well-formed request with a body (a POST) or without."""
    if method != "POST":
        return [(b"Authorization", KEY)]
    return [(b"Authorization", KEY), (b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(BODY))]


def _with(name: bytes, value: bytes) -> Callable[[list[Header]], list[Header]]:
    """``name: value`` in place of the request's own ``name`` header, or added."""
    return lambda headers: [h for h in headers if h[0].lower() != name.lower()] + [(name, value)]


def _twice(name: bytes, value: bytes) -> Callable[[list[Header]], list[Header]]:
    return lambda headers: [h for h in headers if h[0].lower() != name.lower()] + [(name, value), (name, value)]


# name: (how the headers change, the status expected, the header the error names or None)
CASES: dict[str, tuple[Callable[[list[Header]], list[Header]], int, str | None]] = {
    "authorization-latin-1": (_with(b"Authorization", b"Bearer sk-\xe9\xff"), 400, "Authorization"),
    "authorization-utf-8": (_with(b"Authorization", "Bearer sk-clé".encode()), 400, "Authorization"),
    "session-latin-1": (_with(b"x-session-id", b"s\xe9ssion"), 400, "x-session-id"),
    "request-id-latin-1": (_with(b"x-request-id", b"r\xe9q"), 400, "x-request-id"),
    "traceparent-latin-1": (_with(b"traceparent", b"00-\xe9-01"), 400, "traceparent"),
    "tracestate-utf-8": (_with(b"tracestate", "a=é".encode()), 400, "tracestate"),
    "content-type-latin-1": (_with(b"Content-Type", b"application/json\xe9"), 400, "Content-Type"),
    "content-encoding-latin-1": (_with(b"Content-Encoding", b"gz\xe9p"), 400, "Content-Encoding"),
    "authorization-twice": (_twice(b"Authorization", KEY), 400, "Authorization"),
    "content-type-twice": (_twice(b"Content-Type", b"application/json"), 400, None),
    "content-length-twice": (_twice(b"Content-Length", b"0"), 400, None),
    "request-id-twice": (_twice(b"x-request-id", b"r1"), 400, "x-request-id"),
    "session-twice": (_twice(b"x-session-id", b"s1"), 400, "x-session-id"),
    "control-character": (_with(b"Authorization", KEY + b"\x01"), 400, None),
    "header-over-the-limit": (_with(b"x-padding", b"a" * (MAX_FIELD_BYTES + 1)), 431, None),
    "too-many-headers": (lambda h: h + [(b"x-h%d" % i, b"v") for i in range(MAX_HEADERS + 1)], 400, None),
    "unsupported-encoding": (_with(b"Content-Encoding", b"compress"), 415, "Content-Encoding"),
    "unknown-decoder": (_with(b"Content-Encoding", b"br"), 415, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_every_route_of_both_listeners_refuses_a_malformed_header_with_an_openai_4xx(
    gateway: Gateway, case: str
) -> None:
    change, expected, param = CASES[case]
    for listener in (gateway.public, gateway.admin):
        assert listener.routes, listener
        for route_method, path in listener.routes:
            for method in _sent(route_method):
                body = BODY if method == "POST" else b""
                answer = await exchange(listener.url, request(method, path, change(_valid(method)), body))
                where = f"{case}: {method} {listener.url}{path}"
                assert answer.status == expected, (where, answer)
                assert answer.headers["content-type"].startswith("application/json"), (where, answer)
                if method != "HEAD":  # a HEAD answer has no body
                    error = answer.error_for(path)  # Anthropic's shape on its path: no code, no param
                    assert error["type"] == "invalid_request_error", (where, error)
                    assert error.get("code", expected) == expected, (where, error)
                    assert param is None or error.get("param", param) == param, (where, error)
    assert "Traceback" not in gateway.proc.text() and "Error handling request" not in gateway.proc.text()


async def test_a_request_line_over_the_limit_is_a_431_on_both_listeners(gateway: Gateway) -> None:
    for listener in (gateway.public, gateway.admin):
        for route_method, path in listener.routes:
            for method in _sent(route_method):
                target = path + "?pad=" + "a" * MAX_LINE_BYTES
                answer = await exchange(listener.url, request(method, target, _valid(method)))
                assert answer.status == 431, (method, path, answer)
                if method != "HEAD":
                    assert answer.error_for(path)["type"] == "invalid_request_error", answer


async def test_no_malformed_request_reached_a_route(gateway: Gateway) -> None:
    for case in CASES:  # the same requests to the completion routes: none may count as a request answered
        change, _, _ = CASES[case]
        await exchange(gateway.public.url, request("POST", "/v1/chat/completions", change(_valid("POST")), BODY))
    metrics = (await exchange(gateway.admin.url, request("GET", "/metrics", []))).body.decode()
    answered = [line for line in metrics.splitlines() if line.startswith("llmfleet_gateway_requests_total{")]
    assert answered and all(line.endswith(" 0.0") for line in answered), answered


async def test_unknown_paths_and_methods_are_openai_404s_and_405s(gateway: Gateway) -> None:
    for listener in (gateway.public, gateway.admin):
        missing = await exchange(listener.url, request("GET", "/v1/nothing-here", _valid("GET")))
        assert missing.status == 404 and missing.error["type"] == "not_found_error", missing
        for method, path in listener.routes:
            answer = await exchange(listener.url, request("PUT", path, _valid("PUT")))
            if method == "*":  # an engine's development path: 404 for every method
                assert answer.status == 404 and answer.error["type"] == "not_found_error", (path, answer)
                continue
            assert answer.status == 405, (method, path, answer)
            assert method in answer.headers["allow"].split(","), (method, path, answer)
            assert answer.error_for(path)["type"] == "invalid_request_error", (method, path, answer)
