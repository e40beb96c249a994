"""A TCP load balancer for process tests: new connections go round-robin to the backends whose readiness answers.

It stands in for an NLB or kube-proxy in front of several gateways: it polls each backend's readiness URL every
``poll_s`` and sends a new connection only to a backend that answered 200 at its last poll, then relays bytes both
ways until either side closes. Connections already open stay where they are, as a load balancer's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Backend", "Balancer"]


@dataclass
class Backend:
    port: int
    readiness_url: str
    ready: bool = False
    seen_unready: bool = False  # a poll answered anything but 200 after one answered 200
    connections: int = 0  # connections sent here


@dataclass
class Balancer:
    backends: list[Backend]
    poll_s: float = 0.1
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Balancer:
        self._tasks.add(asyncio.create_task(self._poll()))
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
            while True:
                for backend in self.backends:
                    try:
                        async with session.get(backend.readiness_url) as resp:
                            ready = resp.status == 200
                    except (aiohttp.ClientError, TimeoutError):
                        ready = False
                    backend.seen_unready |= backend.ready and not ready
                    backend.ready = ready
                await asyncio.sleep(self.poll_s)

    def _pick(self) -> Backend | None:
        ready = [b for b in self.backends if b.ready]
        return ready[next(self._turn) % len(ready)] if ready else None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = self._pick()
        if backend is None:
            writer.close()
            return
        backend.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()
