"""Process fixtures for agent tests: stack files with short timings, agents and control planes on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.protocol.ports import free_port
from tests.agent.receiver import Receiver
from tests.support.procs import Proc, Procs
from tests.support.stacks import write_stack as write_stack_file


class AgentProc(Proc):
    """An ``llmfleet agent``: its status and readiness, and the engines it reported (ended with it). ``/status``
    is read with `auth_headers` (a fleet member's credential, where the agent has control auth on)."""

    auth_headers: dict[str, str] | None = None

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self.get("/status", headers=self.auth_headers).json()
        if data.get("engine_pid"):
            self.extra_pids.add(int(data["engine_pid"]))
        return data

    def readyz(self) -> int:
        return self.get("/readyz").status_code

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """Learn the current engine first, so that a drain that goes wrong leaves no engine behind."""
        try:
            self.status()
        except (httpx.HTTPError, ValueError):
            pass
        return super().stop(timeout_s)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """Write the ``local-sim`` stack (one sim pool, short timings) with dotted-path overrides; return its path."""

    def write(**overrides: Any) -> Path:
        return write_stack_file(tmp_path / "Pulumi.agenttest.yaml", "local-sim", **overrides)

    return write


@pytest.fixture
def start_agent(procs: Procs, tmp_path: Path) -> Callable[..., AgentProc]:
    """Start ``llmfleet agent`` on a free port with short probe and backoff timings; by default wait until ready."""

    def start(
        stack: Path, replica: str = "r0", control_plane: str | None = None, *extra: str, wait_ready: bool = True
    ) -> AgentProc:
        port = free_port()
        argv = [
            "agent", "--stack", str(stack), "--pool", "qwen-7b",
            "--port", str(port), "--replica", replica, "--control-plane", control_plane or "none",
            "--log-dir", str(tmp_path / replica), "--probe-interval", "0.2", "--liveness-failures", "3",
            "--backoff-base", "0.1", "--backoff-max", "0.5", "--lease-retry", "0.3", "--report-backoff-max", "1",
            "--auth", "none",  # an --auth in extra comes later and wins
            *extra,
        ]  # fmt: skip
        log = tmp_path / replica / "agent.log"
        proc = procs.add(AgentProc.start(argv, log, name=replica, url=f"http://127.0.0.1:{port}"), stop_timeout_s=20)
        if wait_ready:
            proc.wait_http("/readyz", timeout_s=40)
            proc.status()
        return proc

    return start


@pytest.fixture
def start_control_plane(procs: Procs, tmp_path: Path) -> Callable[..., Proc]:
    """Start ``llmfleet control-plane --dry-run --auth none`` (on ``port``, else a free one) and wait until it
    answers."""

    def start(stack: Path, port: int | None = None) -> Proc:
        port = port or free_port()
        argv = [
            "control-plane", "--stack", str(stack), "--port", str(port),
            "--dry-run", "--log-dir", str(tmp_path / "cp-agents"), "--auth", "none",
        ]  # fmt: skip
        proc = procs.start(argv, name="control-plane", url=f"http://127.0.0.1:{port}", stop_timeout_s=10)
        proc.wait_http("/healthz", timeout_s=30)
        return proc

    return start


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A real control-plane receiver on loopback recording what agents send."""
    rx = Receiver()
    await rx.start()
    yield rx
    await rx.stop()
