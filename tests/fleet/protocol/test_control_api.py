"""Control API: uvicorn serving in the caller's loop on a socket bound first, leaving the process's signals alone,
and stopping promptly; a taken port fails at bind time."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from fleet.protocol.control_api import ApiServer, bind, create_control_app


async def test_serves_on_the_bound_port_keeps_the_signal_handlers_and_stops_promptly() -> None:
    app = create_control_app("test", "test")

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    try:
        before = signal.getsignal(signal.SIGTERM)
        server = ApiServer(app, bind("127.0.0.1", 0))
        await server.start()
        assert signal.getsignal(signal.SIGTERM) == before  # uvicorn did not take SIGTERM over
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", trust_env=False) as http:
            assert (await http.get("/ping")).json() == {"pong": "yes"}
            started = time.monotonic()
            await server.stop()
        assert time.monotonic() - started < 2.0
        assert server.sock.fileno() == -1  # closed
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def test_a_taken_port_fails_at_bind() -> None:
    taken = bind("127.0.0.1", 0)
    taken.listen()
    try:
        with pytest.raises(OSError):
            bind("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
