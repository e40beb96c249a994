"""An HTTP relay for process tests that runs a fault between an engine's answer and its delivery.

`FaultRelay` listens on loopback (in a thread of its own, with its own event loop, so synchronous tests can use
it) and forwards every request to one backend URL: method, path, query, headers and body. It reads the backend's
whole answer, and when ``trigger(answer body)`` is true (once: the relay disarms itself) it runs ``fault()``
before the answer goes on. A prefill engine killed that way has answered its leg, and the caller has its
``kv_transfer_params``, but the engine is gone when the decode engine comes to read its KV cache: the failure
"between the legs" that no timing could place. Answers are relayed whole (no streaming): it fronts requests whose
answers are whole (a prefill leg, ``/health``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

__all__ = ["FaultRelay"]

_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class FaultRelay:
    backend: str
    trigger: Callable[[bytes], bool] | None = None
    fault: Callable[[], object] | None = None
    fired: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, trigger: Callable[[bytes], bool], fault: Callable[[], object]) -> None:
        """Run ``fault`` before relaying the next answer whose body ``trigger`` accepts."""
        self.fired.clear()
        self.trigger, self.fault = trigger, fault

    def start(self) -> FaultRelay:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fault-relay", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the fault relay did not start within 10 s")
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        session = self._session
        assert session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        try:
            async with session.request(
                request.method, self.backend + request.rel_url.path_qs, data=body, headers=headers
            ) as resp:
                answer = await resp.read()
                status, kept = resp.status, {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        except aiohttp.ClientError:
            return web.Response(status=502, text="backend unreachable")
        trigger, fault = self.trigger, self.fault
        if trigger is not None and fault is not None and trigger(answer):
            self.trigger = self.fault = None
            await asyncio.get_running_loop().run_in_executor(None, fault)
            self.fired.set()
        return web.Response(status=status, body=answer, headers=kept)

    def close(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None
