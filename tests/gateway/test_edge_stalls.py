"""Edge: a gateway process closes a stalled connection at timeouts.headerReadS (headers) or timeouts.bodyReadS (body),
measured from the request's first byte, on both listeners; never before, and within a second after."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from tests.gateway.conftest import admin_url, sim_args
from tests.support.procs import Proc, Procs
from tests.support.raw_http import open_raw
from tests.support.stacks import KEYS, write_stack

HEADER_READ_S = 1.5
BODY_READ_S = 1.0
SLACK_S = 1.0
KEY = f"Authorization: Bearer {KEYS['gold']}\r\n".encode()
HALF_BODY = b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"model": '  # 10 of 100 bytes


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    folder = tmp_path_factory.mktemp("stalls")
    procs = Procs(folder)
    try:
        sim = procs.start(sim_args(), name="sim")
        sim.wait_url("API server")
        timeouts = {"gateway.timeouts.headerReadS": HEADER_READ_S, "gateway.timeouts.bodyReadS": BODY_READ_S}
        stack = write_stack(folder / "Pulumi.stalls.yaml", "gateway", **timeouts)
        proc = procs.start(["gateway", "--stack", str(stack), "--port", "0", "--replica", sim.url], name="gateway")
        proc.wait_url("listening on")
        yield proc
    finally:
        procs.close()


async def _open_for(url: str, chunks: list[bytes], gap_s: float = 0.0) -> tuple[float, bytes]:
    """Send ``chunks`` (``gap_s`` apart), then nothing more; seconds from the first byte until the gateway closed
    the connection, and what it sent before closing."""
    reader, writer = await open_raw(url)

    async def send() -> None:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(gap_s)

    first_byte = time.monotonic()
    sending = asyncio.create_task(send())
    try:
        answer = await asyncio.wait_for(reader.read(), HEADER_READ_S + BODY_READ_S + 20)  # b"" once closed
    except ConnectionResetError:  # closed while bytes were still arriving
        answer = b""
    finally:
        elapsed = time.monotonic() - first_byte
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
        writer.close()
    return elapsed, answer


# name: (listener, what is sent, the timeout it must be closed at, the status it must be answered first or None)
STALLS = {
    "public-mid-headers": ("public", [b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuth"], HEADER_READ_S, None),
    "admin-mid-headers": ("admin", [b"GET /metrics HTTP/1.1\r\nHost: g\r\nAcc"], HEADER_READ_S, None),
    "public-mid-body": (
        "public",
        [b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n" + KEY + HALF_BODY],
        BODY_READ_S,
        408,
    ),
    "public-unread-body": ("public", [b"GET /v1/models HTTP/1.1\r\nHost: g\r\n" + KEY + HALF_BODY], BODY_READ_S, 200),
    "admin-unread-body": ("admin", [b"GET /readyz HTTP/1.1\r\nHost: g\r\n" + HALF_BODY], BODY_READ_S, None),
}


@pytest.mark.parametrize("case", sorted(STALLS))
async def test_a_stalled_request_is_closed_at_its_timeout_from_its_first_byte(gateway: Proc, case: str) -> None:
    listener, chunks, timeout_s, status = STALLS[case]
    url = gateway.url if listener == "public" else admin_url(gateway)
    elapsed, answer = await _open_for(url, chunks)
    assert timeout_s - 0.1 <= elapsed <= timeout_s + SLACK_S, f"{case}: closed after {elapsed:.2f} s"
    if status is not None:
        assert answer.split(b" ", 2)[1] == str(status).encode(), answer[:200]
        assert b"Connection: close" in answer or status == 200, answer[:300]


async def test_a_client_trickling_its_headers_is_closed_at_the_header_timeout(gateway: Proc) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: g\r\nx-slow: " + b"a" * 40  # one byte every 0.1 s, never ending
    elapsed, answer = await _open_for(gateway.url, [head[i : i + 1] for i in range(len(head))], gap_s=0.1)
    assert answer == b"" and HEADER_READ_S - 0.1 <= elapsed <= HEADER_READ_S + SLACK_S, f"closed after {elapsed:.2f} s"
