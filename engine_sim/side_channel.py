"""Side channel: the simulator's stand-in for NIXL's handshake listener, one JSON line each way over TCP.

vLLM's is a ZMQ ROUTER on ``VLLM_NIXL_SIDE_CHANNEL_HOST:PORT`` that serves NIXL agent metadata; the blocks then move
over NIXL itself. Here one plain asyncio listener carries all of it, since a test only needs "the prefill engine is
alive and holds these blocks": each connection sends one request line (a JSON object with an ``op``) and reads one
answer line, and the listener's ``handler`` decides the answer (`engine_sim.nixl`).

`call` is the client. Its failures, as vLLM's handshake meets them (research file sections 1.3, 1.6 and 1.7):

* **A refused connection is retried until the deadline**, every 0.1 s, because a ZMQ socket's ``connect`` never
  fails: it reconnects in the background (``ZMQ_RECONNECT_IVL``, 100 ms) while the request waits for its answer
  under ``zmq.RCVTIMEO``. So a prefill engine that is gone (SIGKILLed, its port closed) fails the handshake after the
  whole timeout, as the captured run did (the error 5.16 s after the decode leg began), not at once.
* **A listener that accepts and never answers** (a stopped or starved process) fails at the deadline too.
* ``retry_refused=False`` fails a refused connection at once: the simulator's choice for a pull from an engine
  already handshaken with (a NIXL READ on a dead peer fails from the transport; its timing is not measured).

Every failure is `SideChannelError`; deadlines are wall seconds (``asyncio`` time), like ``RCVTIMEO``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["RECONNECT_S", "SideChannelError", "SideChannelServer", "call"]

log = logging.getLogger("engine_sim")

RECONNECT_S = 0.1  # ZMQ_RECONNECT_IVL's default
_MAX_LINE = 1 << 20

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class SideChannelError(Exception):
    """The side channel gave no answer: refused until the deadline, no answer in time, or a broken reply."""


class SideChannelServer:
    """Listens on ``host:port`` (port 0: a free one, see `port`); answers each request line with ``handler``'s."""

    def __init__(self, host: str, port: int, handler: Handler) -> None:
        self.host = host
        self._port = port
        self._handler = handler
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one picked for port 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Bind; OSError when the address is taken (the caller refuses to start)."""
        self._server = await asyncio.start_server(self._serve, self.host, self._port, limit=_MAX_LINE)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict):
                answer = await self._handler(message)
            else:
                answer = {"ok": False, "error": "not a JSON object"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            log.debug("side channel: dropped a connection: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def call(
    host: str, port: int, message: dict[str, Any], timeout_s: float, *, retry_refused: bool = True
) -> dict[str, Any]:
    """Send ``message`` to the side channel at ``host:port`` and return its answer, within ``timeout_s`` wall
    seconds; SideChannelError otherwise (see the module docstring for when a refused connection is retried)."""
    try:
        return await asyncio.wait_for(_exchange(host, port, message, retry_refused), timeout_s)
    except TimeoutError:
        raise SideChannelError(f"no answer from {host}:{port} within {timeout_s:g} s") from None


async def _exchange(host: str, port: int, message: dict[str, Any], retry_refused: bool) -> dict[str, Any]:
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=_MAX_LINE)
            break
        except OSError as exc:
            if not retry_refused:
                raise SideChannelError(f"cannot reach {host}:{port}: {exc}") from None
            await asyncio.sleep(RECONNECT_S)
    try:
        writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
    except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
        raise SideChannelError(f"{host}:{port} broke the exchange: {exc}") from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise SideChannelError(f"{host}:{port} answered no JSON object: {line[:80]!r}")
    return answer
