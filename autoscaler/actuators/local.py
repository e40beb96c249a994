"""LocalActuator (``local``): start and stop agent processes on this machine.

Scale-up launches ``llmfleet agent --stack S --pool P --port A --engine-port E --replica ID --control-plane URL``
per new replica (free loopback ports, each agent in its own process group so it and its engine stop together).
Scale-down drains each victim: ``POST /drain`` on its agent takes it out of gateway rotation at once (its next
report says ``draining``), in-flight requests finish, and only then is the process group terminated:

    POST /drain -> wait until the agent exits or reports stopped (<= drain.graceSeconds) -> SIGTERM
                -> wait 10 s -> SIGKILL

The actuator owns the replicas it launched; `close()` drains and stops all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import count
from typing import IO

import httpx

from autoscaler.actuators import Actuator, ActuatorEnv, FleetView
from autoscaler.decisions import Decision, ScaleDown, ScaleUp
from fleet.control_auth import BearerAuth, ClientCredential, Kind
from fleet.ports import free_port
from fleet.spec import FleetSpec, PoolSpec

__all__ = ["LocalActuator"]

log = logging.getLogger("llmfleet.autoscaler.local")


@dataclass
class _Agent:
    replica: str
    pool: str
    agent_url: str
    engine_url: str
    process: subprocess.Popen[bytes]
    log_file: IO[bytes] | None = None
    stopping: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class LocalActuator(Actuator, name="local"):
    lease_store = "file"  # <state dir>/leases.json (autoscaler.lease_stores)

    def __init__(self, spec: FleetSpec, env: ActuatorEnv, command: list[str] | None = None) -> None:
        self.spec = spec
        self.env = env
        self.command = command or [sys.executable, "-m", "fleet.cli"]
        self.agents: dict[str, _Agent] = {}
        self._ids = count(1)
        # POST /drain needs the control plane's credential (the fleet secret `llmfleet up` passes it).
        credential = ClientCredential.from_env(Kind.CONTROL_PLANE)
        self._http = httpx.AsyncClient(timeout=2.0, auth=BearerAuth(credential) if credential else None)

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        return cls(spec, env)

    async def current(self, pool: PoolSpec) -> FleetView:
        self._reap()
        live = [a for a in self.agents.values() if a.pool == pool.name and not a.stopping]
        return FleetView(len(live), tuple(a.replica for a in live), {a.replica: a.agent_url for a in live})

    def _reap(self) -> None:
        for name, agent in list(self.agents.items()):
            if agent.process.poll() is not None and not agent.stopping:
                log.warning("agent %s exited with %s", name, agent.process.returncode)
                self._forget(agent)

    def _forget(self, agent: _Agent) -> None:
        self.agents.pop(agent.replica, None)
        if agent.log_file is not None:
            agent.log_file.close()

    async def apply(self, decision: Decision) -> None:
        if isinstance(decision, ScaleUp):
            for _ in range(decision.delta):
                self.launch(decision.pool)
        elif isinstance(decision, ScaleDown):
            for victim in decision.victims:
                agent = self.agents.get(victim)
                if agent is not None and not agent.stopping:
                    agent.stopping = True
                    agent.task = asyncio.create_task(self._stop(agent, drain=decision.drain))

    def launch(self, pool: str) -> str:
        """Start one agent for ``pool``; returns its replica id."""
        replica = f"{pool}-{next(self._ids)}"
        while replica in self.agents:
            replica = f"{pool}-{next(self._ids)}"
        agent_port, engine_port = free_port(), free_port()
        argv = [
            *self.command,
            "agent",
            "--stack",
            self.env.stack,
            "--pool",
            pool,
            "--port",
            str(agent_port),
            "--engine-port",
            str(engine_port),
            "--replica",
            replica,
            "--control-plane",
            self.env.control_plane_url,
        ]
        out: IO[bytes] | None = None
        if self.env.log_dir is not None:
            self.env.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.env.log_dir / f"agent-{replica}.log", "ab")  # noqa: SIM115 - closed in _forget
            argv += ["--log-dir", str(self.env.log_dir / f"engine-{replica}")]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.agents[replica] = _Agent(
            replica, pool, f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{engine_port}", process, out
        )
        log.info("launched agent %s (pid %d) on port %d", replica, process.pid, agent_port)
        return replica

    async def _stop(self, agent: _Agent, drain: bool) -> None:
        pool = self.spec.pool(agent.pool)
        try:
            if drain and await self._post_drain(agent):
                await self._wait_drained(agent, pool.drain.grace_seconds)
            # SIGTERM also drains (the same path Kubernetes uses); it is the way in when the agent's API is not
            # up yet, e.g. a replica launched a moment ago.
            self._signal(agent, signal.SIGTERM)
            if not await self._wait_exit(agent, 10.0):
                self._signal(agent, signal.SIGKILL)
                await self._wait_exit(agent, 5.0)
        finally:
            self._forget(agent)

    async def _post_drain(self, agent: _Agent) -> bool:
        """Ask the agent to drain; False when it cannot take the request (not listening yet, or refused)."""
        try:
            response = await self._http.post(f"{agent.agent_url}/drain")
        except httpx.HTTPError:
            return False
        return response.status_code < 300

    async def _wait_drained(self, agent: _Agent, grace_s: float) -> None:
        """Until the agent exits or says ``stopped`` (its engine finished in-flight work), at most ``grace_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while loop.time() < deadline and agent.process.poll() is None:
            try:
                status = (await self._http.get(f"{agent.agent_url}/status")).json()
                if status.get("state") == "stopped":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.2)

    async def _wait_exit(self, agent: _Agent, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while agent.process.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return agent.process.poll() is not None

    @staticmethod
    def _signal(agent: _Agent, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(agent.process.pid, sig)

    async def close(self) -> None:
        """Drain and stop every agent this actuator launched."""
        for agent in list(self.agents.values()):
            if not agent.stopping:
                agent.stopping = True
                agent.task = asyncio.create_task(self._stop(agent, drain=True))
        tasks = [a.task for a in list(self.agents.values()) if a.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.aclose()
