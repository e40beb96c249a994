"""Fixtures for gateway tests: real simulator processes, in-process and subprocess gateways, Redis."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleet.protocol.ports import free_port
from gateway.app import GATEWAY, create_admin_app, create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.support.procs import Proc, Procs
from tests.support.stacks import MODEL, spec
from tests.support.wait import wait_for


def sim_args(*extra: str, time_scale: float = 50.0, max_num_seqs: int = 8) -> list[str]:
    return [
        "sim",
        "serve",
        "Qwen/Qwen2.5-7B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--served-model-name",
        MODEL,
        "--max-num-seqs",
        str(max_num_seqs),
        "--time-scale",
        str(time_scale),
        "--startup-seconds",
        "0",
        *extra,
    ]


SimFactory = Callable[..., list[Proc]]


@pytest.fixture
def sims(procs: Procs) -> SimFactory:
    """``sims(["--fault-hang"], [], time_scale=..., env={...})``: start one simulator per argument list, in
    parallel (``env`` added to each one's environment)."""

    def start(*arg_lists: list[str], env: dict[str, str] | None = None, **kw: Any) -> list[Proc]:
        spawned = [
            procs.start(sim_args(*extra, **kw), name=f"sim-{len(procs.started)}", env=env) for extra in arg_lists
        ]
        for proc in spawned:
            proc.wait_url("API server")
        return spawned

    return start


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One healthy, fast simulator shared by a module's tests that inject no fault."""
    procs = Procs(tmp_path_factory.mktemp("sim"))
    try:
        sim = procs.start(sim_args(), name="sim")
        sim.wait_url("API server")
        yield sim
    finally:
        procs.close()


def settings_for(urls: list[str], pool: str = "qwen-7b", **overrides: Any) -> GatewaySettings:
    """Settings over the ``gateway`` preset stack (with ``overrides``, dotted paths) and static replicas."""
    return GatewaySettings(
        spec=spec("gateway", **overrides), static_replicas={pool: urls}, access_log=False, routing_seed=3
    )


async def _site(runner: web.AppRunner) -> str:
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def serve(settings: GatewaySettings, **kw: Any) -> AsyncIterator[tuple[str, Gateway]]:
    """Run the gateway app in this event loop on a free port: (base URL, its Gateway)."""
    async with serve_with_admin(settings, **kw) as (url, _, gateway):
        yield url, gateway


@contextlib.asynccontextmanager
async def serve_with_admin(settings: GatewaySettings, **kw: Any) -> AsyncIterator[tuple[str, str, Gateway]]:
    """`serve`, with the admin listener on a second free port: (public URL, admin URL, its Gateway)."""
    app = create_app(settings, **kw)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    url = await _site(runner)
    admin = web.AppRunner(create_admin_app(app), access_log=None)
    try:
        admin_url = await _site(admin)
        yield url, admin_url, app[GATEWAY]
    finally:
        await runner.cleanup()
        await admin.cleanup()


ADMIN_MARKER = "admin (readiness, metrics) on"


def admin_url(gateway: Proc) -> str:
    """The admin listener (/readyz, /metrics) of a gateway process started by `gateway_procs`."""
    return gateway.logged_url(ADMIN_MARKER)


@pytest.fixture
def gateway_procs(procs: Procs) -> Callable[..., Proc]:
    """Start ``llmfleet gateway`` processes: ``start(stack_path, replica_urls, *extra_args)``."""

    def start(stack: Path | str, replicas: list[str], *extra: str) -> Proc:
        argv = ["gateway", "--stack", str(stack), "--port", "0", "--seed", "1", *extra]
        for url in replicas:
            argv += ["--replica", url]
        proc = procs.start(argv, name=f"gateway-{len(procs.started)}")
        proc.wait_url("listening on")
        return proc

    return start


@pytest.fixture
def start_control_plane(procs: Procs) -> Callable[[Path], Proc]:
    """Start ``llmfleet control-plane --dry-run --auth none`` on a free port (it reports the port it was given): these
    tests are about routing, not credentials (tests/control_plane/test_control_auth_processes.py is)."""

    def start(stack: Path) -> Proc:
        argv = ["control-plane", "--stack", str(stack), "--port", str(free_port()), "--dry-run", "--auth", "none"]
        proc = procs.start(argv, name="control-plane")
        proc.wait_url("listening on")
        return proc

    return start


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """REDIS_URL from the environment, else a redis-server started here, else skip."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no REDIS_URL and no redis-server on PATH (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def accepting() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        return False

    try:
        wait_for(accepting, timeout_s=10, what=f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)
