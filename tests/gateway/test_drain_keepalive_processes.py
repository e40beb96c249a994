"""A gateway started by hand (no propagation delay, no balancer) and stopped under kept-alive clients: no error.

16 raw HTTP/1.1 clients, each holding one keep-alive connection and writing its next request the moment the
previous answer ends (no check that the connection is still open, as http.client and urllib3 do not check between
two requests close together): half short answers, half streams of about half a second, some of which began before
the stop and so told their client to keep the connection. SIGTERM to the gateway: each connection's next request
is served with ``Connection: close``, the client reconnects and finds the listener closed (refused: the gateway
never read that request, so it is no error), and the gateway exits 0. An error is a request written into a
connection the gateway had kept alive that got no answer: the gateway closed under a request it had been sent.
Without the drain's grace (aiohttp's own stop, which closes every idle connection at once and drops what arrives
after) several clients get one.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gateway.drain import IDLE_GRACE_S
from tests.gateway.conftest import SimFactory
from tests.support.procs import Proc
from tests.support.raw_http import open_raw
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

CLIENTS = 16
READ_TIMEOUT_S = 20.0


@dataclass
class Served:
    """What one client saw: answers, the ``Connection: close`` ones among them, refusals of a new connection,
    and errors on requests written into a kept-alive connection."""

    answers: int = 0
    closes: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)


def _request(i: int, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"client {i}"}],
            "max_tokens": 32 if stream else 4,
            "stream": stream,
        }
    ).encode()
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: gateway",
        b"Authorization: Bearer " + KEYS["gold"].encode(),
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """One whole response (Content-Length or chunked): its status and headers (names lower-cased)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")  # the last chunk's trailer ends with an empty line
    else:
        await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers


async def _client(url: str, i: int, served: Served) -> None:
    """Requests back to back over one kept-alive connection, a new one after ``Connection: close``, until the
    listener refuses a connection."""
    request = _request(i, stream=bool(i % 2))
    while True:
        try:
            reader, writer = await open_raw(url)
        except OSError:  # the listener has closed: this request was never sent
            served.refused += 1
            return
        kept_alive = False  # the gateway has told this client it may write another request on the connection
        try:
            while True:
                try:
                    writer.write(request)
                    await writer.drain()
                    status, headers = await asyncio.wait_for(_read_answer(reader), READ_TIMEOUT_S)
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    if kept_alive:
                        served.errors.append(f"client {i} after {served.answers} answers: {exc!r}")
                    # else: a connection that was never answered may never have been accepted (the listener closed
                    # with it queued): nothing says the gateway read its request
                    break
                if status != 200:
                    served.errors.append(f"client {i}: status {status}")
                served.answers += 1
                if headers.get("connection", "").lower() == "close":
                    served.closes += 1
                    break
                kept_alive = True
        finally:
            writer.close()


async def test_a_gateway_stopped_by_hand_serves_every_kept_alive_client_without_an_error(
    sims: SimFactory, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    (sim,) = sims([], time_scale=1.0, max_num_seqs=32)  # real time: a 32-token stream takes ~0.5 s
    gateway = gateway_procs(write_stack(tmp_path / "Pulumi.test.yaml", "gateway"), [sim.url])  # as README starts it
    served = [Served() for _ in range(CLIENTS)]
    running = asyncio.gather(*(_client(gateway.url, i, s) for i, s in enumerate(served)))
    try:
        await async_wait_for(
            lambda: all(s.answers >= 2 for s in served), timeout_s=30.0, what="every client served twice"
        )
        before = [s.answers for s in served]
        gateway.send(signal.SIGTERM)
        stopped = time.monotonic()
        rc = await asyncio.to_thread(gateway.wait, 30.0)
        exited_s = time.monotonic() - stopped
        await asyncio.wait_for(asyncio.shield(running), 30.0)
    finally:
        running.cancel()
    errors = [e for s in served for e in s.errors]
    assert errors == [], errors[:5]
    assert rc == 0, gateway.tail()
    assert "draining" in gateway.text()
    # each connection's next request after the stop was served, told Connection: close, and the client then found
    # the listener closed
    assert [s.answers > b for s, b in zip(served, before, strict=True)] == [True] * CLIENTS
    assert [s.closes for s in served] == [1] * CLIENTS
    assert [s.refused for s in served] == [1] * CLIENTS
    assert exited_s < 10.0, f"the gateway took {exited_s:.1f}s to exit"


async def test_a_stopping_gateway_closes_an_idle_kept_alive_connection_after_the_grace(
    sims: SimFactory, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    (sim,) = sims([])
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway")
    gateway = gateway_procs(stack, [sim.url], "--shutdown-timeout", "20")
    reader, writer = await open_raw(gateway.url)
    try:
        writer.write(_request(0, stream=False))
        status, headers = await _read_answer(reader)
        assert (status, headers.get("connection", "").lower()) == (200, "")  # kept alive
        gateway.send(signal.SIGTERM)
        stopped = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 10.0) == b""  # closed by the gateway, not by its 10 s timer
        closed_s = time.monotonic() - stopped
        rc = await asyncio.to_thread(gateway.wait, 10.0)
    finally:
        writer.close()
    assert rc == 0, gateway.tail()
    assert IDLE_GRACE_S <= closed_s < IDLE_GRACE_S + 2.0, f"closed {closed_s:.2f}s after SIGTERM"
