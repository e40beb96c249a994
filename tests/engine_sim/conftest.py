"""Fixtures: an in-process simulator on a free loopback port, and real `llmfleet sim serve` processes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from engine_sim.engine import Engine
from engine_sim.faults import FaultPolicy, FaultSpec
from engine_sim.server import ServerSettings, create_app
from engine_sim.tokenizer import APPROX, SimTokenizer
from fleet.protocol.ports import free_port
from tests.engine_sim.builders import make_config
from tests.support.procs import Proc, Procs


@dataclass
class SimHandle:
    base_url: str
    engine: Engine
    client: httpx.AsyncClient
    crashes: list[str] = field(default_factory=list)

    async def metrics_text(self) -> str:
        response = await self.client.get("/metrics")
        response.raise_for_status()
        return response.text


StartSim = Callable[..., Awaitable[SimHandle]]


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """``await start_sim(time_scale=.., faults=FaultSpec(..), prompt_details=.., tokenizer=.., runner=..,
    responses_store=.., **EngineConfig overrides)``."""
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def start(*args: Any, **kwargs: Any) -> SimHandle:
        sim, cleanup = await _start(*args, **kwargs)
        cleanups.append(cleanup)
        return sim

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


@contextlib.asynccontextmanager
async def sim_server(**kwargs: Any) -> AsyncIterator[SimHandle]:
    """The same server as `start_sim`, as a context manager (for module-scoped fixtures)."""
    sim, cleanup = await _start(**kwargs)
    try:
        yield sim
    finally:
        await cleanup()


async def _start(
    time_scale: float = 20.0,
    faults: FaultSpec | None = None,
    prompt_details: bool = False,
    tokenizer: SimTokenizer = APPROX,
    runner: str = "generate",
    responses_store: bool = False,
    **overrides: Any,
) -> tuple[SimHandle, Callable[[], Awaitable[None]]]:
    overrides.setdefault("max_model_len", 8192)
    config = make_config(**overrides)
    engine = Engine(config, time_scale=time_scale)
    engine.start()
    settings = ServerSettings(
        model=config.model,
        served_model_names=(config.served_model_name,),
        max_model_len=config.max_model_len,
        enable_prompt_tokens_details=prompt_details,
        tokenizer=tokenizer,
        responses_store=responses_store,
    )
    crashes: list[str] = []
    policy = FaultPolicy(faults or FaultSpec())
    app = create_app(engine, settings, policy, on_crash=lambda: crashes.append("x"), runner=runner)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    base = f"http://{host}:{port}"
    client = httpx.AsyncClient(base_url=base, timeout=30.0)

    async def cleanup() -> None:
        await client.aclose()
        await runner.cleanup()
        await engine.stop()

    return SimHandle(base, engine, client, crashes), cleanup


async def sse_events(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    """POST a streaming request; the decoded ``data:`` payloads, ``"[DONE]"`` kept as a string."""
    events: list[Any] = []
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


SpawnSim = Callable[..., Proc]


@pytest.fixture
def spawn_sim(procs: Procs) -> SpawnSim:
    """Start ``llmfleet sim serve`` on a free port (not waiting for it); every process is killed at teardown."""

    def spawn(*flags: str, model: str = "Qwen/Qwen2.5-7B-Instruct") -> Proc:
        port = free_port()
        argv = ["sim", "serve", model, "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--served-model-name", "qwen", "--max-model-len", "4096", *flags]
        return procs.start(argv, name=f"sim-{port}", url=f"http://127.0.0.1:{port}")

    return spawn
