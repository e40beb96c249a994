"""Engines: real vLLM engines started through ``llmfleet agent`` (the product's launch path), for the tier's tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet.protocol.ports import free_port
from tests.agent.conftest import AgentProc
from tests.support.procs import Procs
from tests.support.wait import wait_for
from tests.vllm.conftest import START_S

__all__ = ["Replica", "start_replica"]


class Replica(AgentProc):
    """One agent and its real engine: the engine's URL and KV-events address, known from the start."""

    engine_url: str = ""
    kv_events: str = ""

    def engine_pids(self) -> set[int]:
        """The engine's process group (the agent starts it in a session of its own), for a SIGKILL."""
        pid = self.status()["engine_pid"]
        return {int(pid)} if pid else set()

    def kill_engine(self) -> int:
        """SIGKILL the engine's whole process group (API server, engine core, worker); returns the group."""
        (pid,) = self.engine_pids()
        os.killpg(pid, signal.SIGKILL)
        return pid


def start_replica(
    procs: Procs,
    stack: Path,
    replica: str,
    *extra: str,
    wait_ready: bool = True,
    stop_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
    pool: str = "qwen-7b",
) -> Replica:
    """Start ``llmfleet agent`` for ``replica`` of the stack's ``pool`` (a prefill role pool too) with no control
    plane, its engine on free ports (``env`` added to its environment); by default wait (up to `START_S`) until the
    agent says ready."""
    port, engine_port, kv_port = free_port(), free_port(), free_port()
    argv = [
        "agent", "--stack", str(stack), "--pool", pool, "--replica", replica,
        "--port", str(port), "--engine-port", str(engine_port), "--kv-events-port", str(kv_port),
        "--control-plane", "none", "--auth", "none", "--log-dir", str(procs.folder / replica),
        "--probe-interval", "0.5", *extra,
    ]  # fmt: skip
    log = procs.folder / replica / "agent.log"
    proc = Replica.start(argv, log, name=replica, url=f"http://127.0.0.1:{port}", env=env)
    proc.engine_url = f"http://127.0.0.1:{engine_port}"
    proc.kv_events = f"tcp://127.0.0.1:{kv_port}"
    procs.add(proc, stop_timeout_s=stop_timeout_s)
    if wait_ready:
        wait_ready_replica(proc)
    return proc


def wait_ready_replica(proc: Replica, timeout_s: float = START_S) -> dict[str, Any]:
    """Wait until the agent says ready; its status then (which also records the engine's pid). Fails at once when
    the agent gives up on its engine (``failed``: it crash-looped), with why and the engine's last lines."""

    def ready() -> dict[str, Any] | None:
        if proc.process.poll() is not None:
            raise AssertionError(f"{proc.name} exited with {proc.process.returncode}:\n{proc.tail()}")
        status = proc.status()
        if status["state"] == "failed":
            log = status["engine"]["log"]
            tail = Path(log).read_text(errors="replace")[-3000:] if log and Path(log).exists() else ""
            raise AssertionError(f"{proc.name} gave up on its engine: {status['last_error']}\n{tail}")
        return status if status["ready"] else None

    return wait_for(ready, timeout_s=timeout_s, interval_s=0.5, what=f"{proc.name} ready", diagnostics=proc.tail)
