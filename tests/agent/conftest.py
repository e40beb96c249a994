"""Process fixtures for agent tests: stack files with short timings, agents and control planes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleet.ports import free_port
from tests.agent.builders import stack_document
from tests.agent.receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until truthy; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if value:
                return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(interval_s)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class Proc:
    """A spawned llmfleet process (its own session) and the engine pids it reported."""

    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    name: str
    engine_pids: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 3.0) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=timeout, trust_env=False)

    def post(self, path: str, timeout: float = 3.0) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=timeout, trust_env=False)

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self.get("/status").json()
        if data.get("engine_pid"):
            self.engine_pids.add(int(data["engine_pid"]))
        return data

    def readyz(self) -> int:
        return self.get("/readyz").status_code

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (drain), then SIGKILL whatever is left: the process group and every engine it reported."""
        if self.name != "control-plane":
            with contextlib.suppress(httpx.HTTPError, ValueError):
                self.status()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout_s)
        _kill_group(self.popen.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        for pid in self.engine_pids:
            _kill_group(pid)


def _spawn(argv: list[str], log: Path, name: str, port: int) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return Proc(popen, port, log, name)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """Write a stack file (one sim pool, short timings) and return its path; kwargs override pool keys."""

    def write(pool_overrides: dict[str, Any] | None = None, **config: Any) -> Path:
        path = tmp_path / "Pulumi.agenttest.yaml"
        path.write_text(yaml.safe_dump(stack_document(pool_overrides, **config), sort_keys=False))
        return path

    return write


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(
        stack: Path, replica: str = "r0", control_plane: str | None = None, *extra: str, wait_ready: bool = True
    ) -> Proc:
        port = free_port()
        argv = [
            sys.executable, "-m", "fleet.cli", "agent", "--stack", str(stack), "--pool", "qwen-7b",
            "--port", str(port), "--replica", replica, "--control-plane", control_plane or "none",
            "--log-dir", str(tmp_path / replica), "--probe-interval", "0.2", "--liveness-failures", "3",
            "--backoff-base", "0.1", "--backoff-max", "0.5", "--lease-retry", "0.3", "--report-backoff-max", "1",
            *extra,
        ]  # fmt: skip
        proc = _spawn(argv, tmp_path / replica / "agent.log", replica, port)
        started.append(proc)
        if wait_ready:
            wait_for(lambda: proc.readyz() == 200, 40, what=f"{replica} ready\n{proc.log_tail()}")
            proc.status()
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def start_control_plane(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(stack: Path, port: int | None = None) -> Proc:
        port = port or free_port()
        argv = [
            sys.executable, "-m", "fleet.cli", "control-plane", "--stack", str(stack), "--port", str(port),
            "--dry-run", "--log-dir", str(tmp_path / "cp-agents"),
        ]  # fmt: skip
        proc = _spawn(argv, tmp_path / "control-plane.log", "control-plane", port)
        started.append(proc)

        def up() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"control plane exited with {proc.popen.returncode}\n{proc.log_tail()}")
            return proc.get("/healthz").status_code == 200

        wait_for(up, 30, what="control plane up")
        return proc

    yield start
    for proc in started:
        proc.stop(timeout_s=10)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A real control-plane receiver on loopback recording what agents send."""
    rx = Receiver()
    await rx.start()
    yield rx
    await rx.stop()
