"""Fixtures: a whole local fleet (`llmfleet up`) on free loopback ports, with short timings."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from control_plane.actuators.local_state import pid_alive
from fleet.protocol.control_auth import CONTROL_TOKEN_ENV
from fleet.protocol.keys import DEMO_API_KEY
from fleet.protocol.ports import free_port
from llmfleet.local.procs import descendants
from llmfleet.local.up import TOKEN_FILE
from tests.support.procs import Proc
from tests.support.stacks import write_stack
from tests.support.wait import async_wait_for

T = TypeVar("T")

# Short timings: a slow simulated GPU with 4 sequences a replica, so a few requests per second queue up; the
# control loop ticks twice a second and scale-down waits 4 s of quiet.
FAST: dict[str, Any] = {
    "environment": "e2e",
    "pools": [
        {
            "name": "qwen-7b",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "servedModelName": "qwen2.5-7b-instruct",
            "engine": {
                "kind": "sim",
                "maxNumSeqs": 4,
                "maxModelLen": 4096,
                "responsesStore": True,  # through the agent to the engine's environment
                "sim": {"gpuProfile": "a100-80gb", "startupSeconds": 0.3},
            },
            "replicas": {"min": 1, "max": 3},
            "workload": {"meanPromptTokens": 64, "meanOutputTokens": 48, "peakQps": 10},
            "coldStartSeconds": 8,  # a deadline, not a delay: a busy two-core machine takes ~3 s to import a sim
            # TTFT priority is covered by the guard-rail tests; here the agent's 30 s TTFT window would hold
            # scale-down for 30 s after the burst, so the SLO is set out of the way.
            "slo": {"ttftP99Ms": 20000},
            "drain": {"graceSeconds": 10, "propagationSeconds": 0.5},
        }
    ],
    "autoscaling": {
        "actuator": "local",
        "intervalS": 0.5,
        # The envelope releases capacity over 6 cold starts by default; 18 s keeps the scale-in within the tests.
        "policy": {"name": "target-tracking", "params": {"releaseTimeConstantS": 18}},
        "targetQueuePerReplica": 2,
        "scaleDownStabilizationS": 4,
        "maxScaleUpStep": 2,
    },
    "controlPlane": {"reportIntervalS": 0.25, "staleAfterS": 2},
    "gateway.routing": {"staleAfterS": 2, "scrapeIntervalS": 0.25},
}


def fast_stack(tmp: Path, **overrides: Any) -> Path:
    """The shipped local stack with FAST's keys (and ``overrides``) replaced, written to ``tmp``."""
    return write_stack(tmp / "Pulumi.e2e.yaml", "local", **{**FAST, **overrides})


@dataclass
class Fleet:
    up: Proc
    gateway: str
    control_plane: str
    log_dir: Path
    output: list[str]

    @property
    def secret(self) -> str:
        """The fleet secret, as ``up`` leaves it for operator commands in ``<log dir>/control-token``."""
        return (self.log_dir / TOKEN_FILE).read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        """The control plane's reads need a credential: an operator's, holding the fleet secret."""
        return {"Authorization": f"Bearer control-plane:{self.secret}"}

    @property
    def env(self) -> dict[str, str]:
        """The environment of an operator command (``llmfleet status``) run against this fleet."""
        return {**os.environ, CONTROL_TOKEN_ENV: self.secret}

    def pools(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.control_plane}/v1/pools", timeout=2, headers=self.headers)
        pools: list[dict[str, Any]] = answer.json()["pools"]
        return pools

    def replicas(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.control_plane}/v1/pools/qwen-7b/replicas", timeout=2, headers=self.headers).json()
        replicas: list[dict[str, Any]] = body["replicas"]
        return replicas

    def decisions(self) -> list[dict[str, Any]]:
        params = {"limit": 1000}
        body = httpx.get(f"{self.control_plane}/v1/decisions", params=params, timeout=2, headers=self.headers).json()
        decisions: list[dict[str, Any]] = body["decisions"]
        return decisions

    async def until(self, predicate: Callable[[], Awaitable[T]], *, timeout_s: float, what: str) -> T:
        """Poll ``predicate`` every 0.2 s; an HTTP error or an answer without the expected keys counts as not
        yet; fails with the fleet's logs."""
        return await async_wait_for(
            predicate,
            timeout_s=timeout_s,
            what=what,
            interval_s=0.2,
            diagnostics=self.logs,
            ignore=(httpx.HTTPError, KeyError),
        )

    async def until_restarted(self, replicas: list[str], *, timeout_s: float) -> list[dict[str, Any]]:
        """Poll the control plane's lease history until each of ``replicas`` released a restart lease; assert they
        restarted one at a time (grant, release, grant, release); the history."""
        async with httpx.AsyncClient(base_url=self.control_plane, timeout=5, headers=self.headers) as cp:

            async def released() -> list[dict[str, Any]] | None:
                history: list[dict[str, Any]] = (await cp.get("/v1/leases")).json()["history"]
                done = {h["replica"] for h in history if h["event"] == "release"}
                return history if done >= set(replicas) else None

            history = await self.until(released, timeout_s=timeout_s, what="the replicas' planned restarts")
        order = [(h["event"], h["replica"]) for h in history if h["event"] in ("grant", "release")]
        first, second = order[0][1], order[2][1]
        assert order[:4] == [("grant", first), ("release", first), ("grant", second), ("release", second)], order
        assert {first, second} == set(replicas)
        return history

    def tree(self) -> set[int]:
        return {self.up.process.pid} | descendants(self.up.process.pid)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.log_dir.glob("*.log"))
        )


def start_fleet(stack: Path, log_dir: Path, *extra: str) -> Fleet:
    """Start ``llmfleet up`` (its output in ``log_dir``/up.log) on free ports, with ``extra`` arguments; returns
    at once."""
    gw, admin, cp = free_port(), free_port(), free_port()
    argv = [
        "up", "--stack", str(stack), "--port", str(gw), "--admin-port", str(admin), "--control-plane-port", str(cp),
        "--log-dir", str(log_dir), "--ready-timeout", "60", *extra,
    ]  # fmt: skip
    up = Proc.start(argv, log_dir / "up.log")
    return Fleet(up, f"http://127.0.0.1:{gw}", f"http://127.0.0.1:{cp}", log_dir, [])


def read_until_up(fleet: Fleet, timeout_s: float = 60.0) -> str:
    """Wait until ``up`` has printed its whole banner; returns its output so far."""
    text = fleet.up.wait_log("Ctrl-C drains and stops everything.", timeout_s=timeout_s, diagnostics=fleet.logs)
    fleet.output.append(text)
    return text


def stop_fleet(fleet: Fleet, timeout_s: float = 40.0) -> tuple[int | None, set[int]]:
    """SIGINT ``up`` (like Ctrl-C); returns its exit status and the processes of its tree still alive after."""
    tree = fleet.tree()
    if fleet.up.process.poll() is None:
        fleet.up.send(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            fleet.up.wait(timeout_s)
    left = {pid for pid in tree if pid_alive(pid)}
    return fleet.up.process.returncode, left


class Load:
    """Streamed chat completions for ``model`` (an alias or a served model) at ``rps`` until `stop`: answers by pool
    (the replica header), and every failure by status (0: no answer; a 200 counts as failed without ``[DONE]``, with
    an error event or with an engine's abort)."""

    def __init__(self, fleet: Fleet, rps: float = 25.0, model: str = "chat", max_tokens: int = 6) -> None:
        self.fleet, self.rps, self.model, self.max_tokens = fleet, rps, model, max_tokens
        self.ok: Counter[str] = Counter()
        self.failed: Counter[int] = Counter()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _one(self, client: httpx.AsyncClient, n: int) -> None:
        messages = [{"role": "user", "content": f"hi {n}"}]
        body = {"model": self.model, "stream": True, "max_tokens": self.max_tokens, "messages": messages}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines = [line async for line in response.aiter_lines()]
                cut = any('"error"' in line or '"finish_reason":"abort"' in line for line in lines)
                if response.status_code != 200 or "data: [DONE]" not in lines or cut:
                    self.failed[response.status_code] += 1
                    return
                self.ok[response.headers["x-llmfleet-replica"].rsplit("-", 1)[0]] += 1
        except httpx.HTTPError:
            self.failed[0] += 1

    async def _run(self) -> None:
        headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
        async with httpx.AsyncClient(base_url=self.fleet.gateway, headers=headers, timeout=30) as client:
            pending: set[asyncio.Task[None]] = set()
            n = 0
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(client, n))
                pending.add(task)
                task.add_done_callback(pending.discard)
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=1.0 / self.rps)
            await asyncio.gather(*pending)  # every request in flight finishes

    async def __aenter__(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Send no more; return once every request sent has finished."""
        self._stop.set()
        assert self._task is not None
        await self._task

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


@contextlib.contextmanager
def running_fleet(stack: Path, log_dir: Path, *extra: str) -> Iterator[Fleet]:
    """A fleet of ``stack`` (``up`` given ``extra`` arguments), up (banner printed) while the block runs; stopped
    after, leaving no process."""
    running = start_fleet(stack, log_dir, *extra)
    try:
        read_until_up(running)
        yield running
    finally:
        tree = running.tree()
        code, left = stop_fleet(running)
        for pid in left | {p for p in tree if pid_alive(p)}:  # never leave a process behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        running.up.kill()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    with running_fleet(fast_stack(tmp), tmp / "logs") as running:
        yield running


# The engine fails half of the generation requests (engine_sim/faults.py) with a 500: the replica still warms up
# (its warm-up request is retried) and serves, while its pool's error budget burns.
FAULTY = {"pools.0.engine.extraArgs": ["--fault-error-rate", "0.5", "--fault-error-status", "500"]}


@pytest.fixture(scope="package")
def faulty_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One FAST fleet whose engine fails half the requests (`FAULTY`), shared by the modules that watch a fleet:
    a local Prometheus (where ``prometheus`` is on PATH), and the live view in its log, its PNG in
    ``<log dir>/live.png``."""
    tmp = tmp_path_factory.mktemp("faulty")
    live = ["--live", "--live-interval", "1", "--live-png", str(tmp / "logs" / "live.png"), "--live-png-every", "2"]
    with running_fleet(fast_stack(tmp, **FAULTY), tmp / "logs", *live) as running:
        yield running
