"""Fixtures: a whole local fleet (`llmfleet up`) on free loopback ports, with short timings."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleet.loader import STACKS_DIR
from fleet.local.procs import descendants
from fleet.ports import free_port

# Short timings: a slow simulated GPU with 4 sequences a replica, so a few requests per second queue up; the
# control loop ticks twice a second and scale-down waits 4 s of quiet.
FAST: dict[str, Any] = {
    "llmfleet:environment": "e2e",
    "llmfleet:pools": [
        {
            "name": "qwen-7b",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "servedModelName": "qwen2.5-7b-instruct",
            "engine": {
                "kind": "sim",
                "maxNumSeqs": 4,
                "maxModelLen": 4096,
                "sim": {"gpuProfile": "a100-80gb", "startupSeconds": 0.3},
            },
            "replicas": {"min": 1, "max": 3},
            "workload": {"meanPromptTokens": 64, "meanOutputTokens": 48, "peakQps": 10},
            "coldStartSeconds": 3,
            # TTFT priority is covered by the guard-rail tests; here the agent's 30 s TTFT window would hold
            # scale-down for 30 s after the burst, so the SLO is set out of the way.
            "slo": {"ttftP99Ms": 20000},
            "drain": {"graceSeconds": 10, "propagationSeconds": 0.5},
        }
    ],
    "llmfleet:autoscaling": {
        "actuator": "local",
        "intervalS": 0.5,
        "targetQueuePerReplica": 2,
        "scaleDownStabilizationS": 4,
        "maxScaleUpStep": 2,
    },
    "llmfleet:controlPlane": {"reportIntervalS": 0.25, "staleAfterS": 2},
}


def fast_stack(tmp: Path, **overrides: Any) -> Path:
    """A copy of the local stack with FAST's keys (and ``overrides``) replaced, written to ``tmp``."""
    document = yaml.safe_load((STACKS_DIR / "Pulumi.local.yaml").read_text())
    config = document["config"]
    config.update(copy.deepcopy(FAST))
    config["llmfleet:gateway"] = {
        **config["llmfleet:gateway"],
        "routing": {"staleAfterS": 2, "scrapeIntervalS": 0.25},
    }
    config.update(overrides)
    path = tmp / "Pulumi.e2e.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@dataclass
class Fleet:
    process: subprocess.Popen[str]
    gateway: str
    control_plane: str
    log_dir: Path
    output: list[str]

    def pools(self) -> list[dict[str, Any]]:
        pools: list[dict[str, Any]] = httpx.get(f"{self.control_plane}/v1/pools", timeout=2).json()["pools"]
        return pools

    def replicas(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.control_plane}/v1/pools/qwen-7b/replicas", timeout=2).json()
        replicas: list[dict[str, Any]] = body["replicas"]
        return replicas

    def decisions(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.control_plane}/v1/decisions", params={"limit": 1000}, timeout=2).json()
        decisions: list[dict[str, Any]] = body["decisions"]
        return decisions

    def tree(self) -> set[int]:
        return {self.process.pid} | descendants(self.process.pid)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.log_dir.glob("*.log"))
        )


def wait_for(predicate: Any, timeout_s: float, what: str, fleet: Fleet | None = None, step: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` (and the fleet's logs) on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if value:
                return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{fleet.logs() if fleet else ''}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


def start_fleet(stack: Path, log_dir: Path) -> Fleet:
    gw, cp = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "up",
            "--stack",
            str(stack),
            "--port",
            str(gw),
            "--control-plane-port",
            str(cp),
            "--log-dir",
            str(log_dir),
            "--ready-timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Fleet(process, f"http://127.0.0.1:{gw}", f"http://127.0.0.1:{cp}", log_dir, [])


def read_until_up(fleet: Fleet, timeout_s: float = 60.0) -> str:
    """Collect ``up``'s output (a reader thread) until its banner is complete; returns the output so far."""
    stdout = fleet.process.stdout
    assert stdout is not None
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = "".join(lines)
        if "Ctrl-C drains and stops everything." in text:
            fleet.output.append(text)
            return text
        if fleet.process.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"llmfleet up did not come up:\n{''.join(lines)}\n{fleet.logs()}")


def stop_fleet(fleet: Fleet, timeout_s: float = 40.0) -> tuple[int | None, set[int]]:
    """SIGINT ``up`` (like Ctrl-C); returns its exit status and the processes of its tree still alive after."""
    tree = fleet.tree()
    if fleet.process.poll() is None:
        fleet.process.send_signal(signal.SIGINT)
        try:
            fleet.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    left = {pid for pid in tree if alive(pid)}
    return fleet.process.returncode, left


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    running = start_fleet(fast_stack(tmp), tmp / "logs")
    try:
        read_until_up(running)
        yield running
    finally:
        tree = running.tree()
        code, left = stop_fleet(running)
        for pid in left | {p for p in tree if alive(p)}:  # never leave a process behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if running.process.poll() is None:
            running.process.kill()
        running.process.wait()
        if running.process.stdout is not None:
            running.process.stdout.close()
