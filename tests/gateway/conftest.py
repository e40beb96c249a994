"""Fixtures for gateway tests: real simulator processes, in-process and subprocess gateways, Redis."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from fleet.ports import free_port
from gateway.app import GATEWAY, create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.gateway.builders import BASE_CONFIG, MODEL

ROOT = Path(__file__).resolve().parents[2]
LLMFLEET = [sys.executable, "-m", "fleet.cli"]
_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def _wait_started(proc: subprocess.Popen[bytes], log: Path, marker: str, timeout_s: float = 30.0) -> Proc:
    """Wait for ``marker`` and a URL after it in the process's log; RuntimeError (with the log) otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if marker in text:
            match = _URL.search(text[text.index(marker) :])
            if match:
                return Proc(proc, match.group(1), log)
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited early:\n{text}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{proc.args!r} did not start within {timeout_s}s:\n{log.read_text(errors='replace')}")


def _start(args: list[str], log: Path, marker: str, timeout_s: float = 30.0) -> Proc:
    return _wait_started(_spawn(args, log), log, marker, timeout_s)


def sim_args(*extra: str, time_scale: float = 50.0, max_num_seqs: int = 8) -> list[str]:
    return [
        *LLMFLEET,
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
def sims(tmp_path: Path) -> Iterator[SimFactory]:
    """``sims(["--fault-hang"], [], time_scale=...)``: start one simulator per argument list, in parallel."""
    started: list[Proc] = []

    def start(*arg_lists: list[str], **kw: Any) -> list[Proc]:
        logs = [tmp_path / f"sim-{len(started) + i}.log" for i in range(len(arg_lists))]
        spawned = [_spawn(sim_args(*extra, **kw), log) for extra, log in zip(arg_lists, logs, strict=True)]
        try:
            procs = [_wait_started(proc, log, "API server") for proc, log in zip(spawned, logs, strict=True)]
        except RuntimeError:
            for proc in spawned:
                proc.kill()
            raise
        started.extend(procs)
        return procs

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One healthy, fast simulator shared by a module's tests that inject no fault."""
    proc = _start(sim_args(), tmp_path_factory.mktemp("sim") / "sim.log", "API server")
    yield proc
    proc.kill()


def settings_for(urls: list[str], pool: str = "qwen-7b", **spec_overrides: Any) -> GatewaySettings:
    from tests.gateway.builders import fleet_spec

    return GatewaySettings(
        spec=fleet_spec(**spec_overrides), static_replicas={pool: urls}, access_log=False, routing_seed=3
    )


@contextlib.asynccontextmanager
async def serve(settings: GatewaySettings, **kw: Any) -> AsyncIterator[tuple[str, Gateway]]:
    """Run the gateway app in this event loop on a free port: (base URL, its Gateway)."""
    app = create_app(settings, **kw)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app[GATEWAY]
    finally:
        await runner.cleanup()


def write_stack(tmp_path: Path, name: str = "test", **overrides: Any) -> Path:
    config = {k: v for k, v in BASE_CONFIG.items()}
    for key, value in overrides.items():
        config[f"llmfleet:{key}"] = value
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


@pytest.fixture
def gateway_procs(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start ``llmfleet gateway`` processes: ``start(stack_path, replica_urls, *extra_args)``."""
    started: list[Proc] = []

    def start(stack: Path, replicas: list[str], *extra: str) -> Proc:
        args = [*LLMFLEET, "gateway", "--stack", str(stack), "--port", "0", "--seed", "1", *extra]
        for url in replicas:
            args += ["--replica", url]
        proc = _start(args, tmp_path / f"gateway-{len(started)}.log", "listening on")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


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
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)
