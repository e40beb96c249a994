"""Edge: a client's bad encoding, malformed target, reset or disconnect reaching a gateway process is one count in
``llmfleet_gateway_client_errors_total{kind}`` and a 4xx while the client is there to read it; the gateway's log
never shows a traceback for any of them."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Iterator

import pytest

from tests.gateway.conftest import admin_url, sim_args
from tests.support.procs import Proc, Procs
from tests.support.raw_http import Header, exchange, open_raw, request
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200}
BODY = json.dumps(CHAT).encode()
HEADERS: list[Header] = [(b"Authorization", f"Bearer {KEYS['gold']}".encode()), (b"Content-Type", b"application/json")]
GZIP, CHUNKED = (b"Content-Encoding", b"gzip"), (b"Transfer-Encoding", b"chunked")
_SAMPLE = re.compile(r'^llmfleet_gateway_client_errors_total\{kind="([a-z_]+)"\} ([0-9.e+]+)$', re.M)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    folder = tmp_path_factory.mktemp("client-errors")
    procs = Procs(folder)
    try:
        sim = procs.start(sim_args(time_scale=1.0), name="sim")  # 200 tokens take seconds: a stream stays open
        sim.wait_url("API server")
        stack = write_stack(folder / "Pulumi.client-errors.yaml", "gateway")
        proc = procs.start(["gateway", "--stack", str(stack), "--port", "0", "--replica", sim.url], name="gateway")
        proc.wait_url("listening on")
        yield proc
    finally:
        procs.close()


async def _counts(gateway: Proc) -> dict[str, float]:
    page = await exchange(admin_url(gateway), request("GET", "/metrics", []))
    return {kind: float(value) for kind, value in _SAMPLE.findall(page.body.decode())}


def _post(body: bytes, *extra: Header, path: str = "/v1/chat/completions") -> bytes:
    return request("POST", path, [*HEADERS, *extra, (b"Content-Length", b"%d" % len(body))], body)


# name: (the request, the status answered, the kind counted)
ANSWERED = {
    "corrupt-gzip": (_post(b"\x1f\x8b\x08\x00 not gzip at all", GZIP), 400, "encoding"),
    # A gzip stream cut short inflates to the JSON it held so far, without an error: that JSON is cut short.
    "truncated-gzip": (_post(gzip.compress(BODY)[:-12], GZIP), 400, "body"),
    "corrupt-gzip-never-read": (
        request(
            "GET", "/v1/models", [*HEADERS, (b"Content-Encoding", b"gzip"), (b"Content-Length", b"9")], b"\x1fnot gz!"
        ),
        200,  # the route reads no body: it answers; dropping the body finds it corrupt
        "encoding",
    ),
    "unsupported-encoding": (_post(BODY, (b"Content-Encoding", b"compress")), 415, "encoding"),
    "invalid-utf-8-json": (_post(b'{"model": "\xff\xfe", "messages": []}'), 400, "body"),
    "malformed-target": (request("GET", "http://[::1/v1/models", HEADERS), 400, "url"),
    "broken-percent-encoding": (request("GET", "/v1/mo%zzdels", HEADERS), 400, "url"),
    "percent-encoding-not-utf-8": (request("GET", "/v1/models%ff", HEADERS), 400, "url"),
    "broken-chunk-framing": (
        request(
            "POST", "/v1/chat/completions", [*HEADERS, (b"Transfer-Encoding", b"chunked")], b"zz\r\n{}\r\n0\r\n\r\n"
        ),
        400,
        "malformed",
    ),
}


def _no_traceback(gateway: Proc) -> None:
    log = gateway.text()
    assert "Traceback" not in log and "Error handling request" not in log, gateway.tail()


@pytest.mark.parametrize("case", sorted(ANSWERED))
async def test_a_bad_encoding_or_target_is_a_counted_4xx_without_a_traceback(gateway: Proc, case: str) -> None:
    data, status, kind = ANSWERED[case]
    before = await _counts(gateway)
    answer = await exchange(gateway.url, data)
    assert answer.status == status, (case, answer)
    if status >= 400:
        assert answer.error["type"] == "invalid_request_error", (case, answer)

    async def counted() -> bool:
        return (await _counts(gateway))[kind] == before[kind] + 1

    await async_wait_for(counted, timeout_s=5, what=f"{case} counted as kind {kind}")
    after = await _counts(gateway)
    assert {k: v for k, v in after.items() if k != kind} == {k: v for k, v in before.items() if k != kind}
    _no_traceback(gateway)


async def _reset_mid_body(gateway: Proc) -> None:
    reader, writer = await open_raw(gateway.url)
    del reader  # Unused.
    writer.write(_post(BODY + b" " * 1000)[: -1000 - len(BODY) // 2])  # headers promise more than is sent
    await writer.drain()
    await asyncio.sleep(0.3)  # the route is reading the body
    writer.transport.abort()  # RST


async def _gone_mid_stream(gateway: Proc) -> None:
    reader, writer = await open_raw(gateway.url)
    writer.write(_post(json.dumps({**CHAT, "stream": True}).encode()))
    await writer.drain()
    assert (await reader.readuntil(b"data: ")).startswith(b"HTTP/1.1 200")
    writer.close()  # the client leaves while the stream goes on


async def _gone_waiting_for_the_answer(gateway: Proc) -> None:
    reader, writer = await open_raw(gateway.url)
    del reader  # Unused.
    writer.write(_post(BODY))
    await writer.drain()
    await asyncio.sleep(0.3)  # 200 tokens at the simulator's pace: the answer is seconds away
    writer.transport.abort()


GONE = {
    "reset-mid-body": _reset_mid_body,
    "gone-mid-stream": _gone_mid_stream,
    "gone-before-answer": _gone_waiting_for_the_answer,
}


@pytest.mark.parametrize("case", sorted(GONE))
async def test_a_client_that_leaves_is_one_disconnect_without_a_traceback(gateway: Proc, case: str) -> None:
    before = await _counts(gateway)
    await GONE[case](gateway)

    async def counted() -> bool:
        return (await _counts(gateway))["disconnect"] == before["disconnect"] + 1

    await async_wait_for(counted, timeout_s=10, what=f"{case} counted as a disconnect")
    await asyncio.sleep(0.3)  # once, not twice
    assert (await _counts(gateway))["disconnect"] == before["disconnect"] + 1
    _no_traceback(gateway)
