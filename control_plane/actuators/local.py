"""LocalActuator (``local``): start and stop agent processes on this machine.

Scale-up launches ``llmfleet agent --stack S --pool P --port A --engine-port E --replica ID --control-plane URL``
per new replica (free loopback ports, each agent in its own process group so it and its engine stop together).
Scale-down drains each victim: ``POST /drain`` on its agent takes it out of gateway rotation at once (its next
report says ``draining``), in-flight requests finish, and only then is the process group terminated:

    POST /drain -> wait until the agent exits or reports stopped (<= drain.graceSeconds) -> SIGTERM
                -> wait 10 s -> SIGKILL

**Sleep mode.** A scale-down's ``sleep`` replicas get ``POST /sleep`` on their agent instead (they leave rotation,
their engine sleeps at level 1, the process stays), and a scale-up first sends ``POST /wake`` to its ``wake``
replicas, then launches only the rest.

The actuator owns the replicas it launched; `close()` drains and stops all of them.

**Restarts.** With a state dir (``env.state_dir``) the actuator records every agent it launches (pid, ports) in
``<state dir>/local-agents.json`` (`control_plane.actuators.local_state`). Agents run in sessions of their own, so a
control plane that dies (even SIGKILL on its whole process group) leaves them serving. The next actuator reads
the file before its first answer to ``current`` and adopts each recorded agent that is still alive and is that
agent (checked by pid and command line, then ``GET /status``); from then on an adopted agent is one of its own:
counted in ``current``, drained on scale-down and on `close()`. Replica numbers continue after the recorded ones.
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
from typing import IO

import httpx

from control_plane.actuators import Actuator, ActuatorEnv, FleetView
from control_plane.actuators.local_state import AgentRecord, AgentStateFile, answers, check, pid_alive
from control_plane.scaling.decisions import Decision, ScaleDown, ScaleUp
from control_plane.statefile import StateFileError
from fleet.protocol.control_auth import BearerAuth, ClientCredential, Kind
from fleet.protocol.ports import free_port
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["LocalActuator"]

log = logging.getLogger("llmfleet.autoscaler.local")


@dataclass
class _Agent:
    """A launched agent (``process`` is our child) or an adopted one (``process`` None: another control plane
    started it, so only its pid is known)."""

    record: AgentRecord
    process: subprocess.Popen[bytes] | None
    log_file: IO[bytes] | None = None
    stopping: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def replica(self) -> str:
        return self.record.replica

    @property
    def pool(self) -> str:
        return self.record.pool

    @property
    def agent_url(self) -> str:
        return self.record.agent_url

    def alive(self) -> bool:
        return self.process.poll() is None if self.process is not None else pid_alive(self.record.pid)

    def exit_status(self) -> str:
        return str(self.process.returncode) if self.process is not None else "unknown (adopted)"


class LocalActuator(Actuator, name="local"):
    lease_store = "file"  # <state dir>/leases.json (control_plane.leases.stores)

    def __init__(self, spec: FleetSpec, env: ActuatorEnv, command: list[str] | None = None) -> None:
        self.spec = spec
        self.env = env
        self.command = command or [sys.executable, "-m", "llmfleet.cli"]
        self.agents: dict[str, _Agent] = {}
        self.adopted: list[str] = []  # replicas taken over from a previous control plane
        self._next_id = 1
        self._state = AgentStateFile(env.state_dir) if env.state_dir is not None else None
        self._started = self._state is None  # with a state file, `current` adopts first
        # POST /drain needs the control plane's credential (the fleet secret `llmfleet up` passes it).
        credential = ClientCredential.from_env(Kind.CONTROL_PLANE)
        self._http = httpx.AsyncClient(timeout=2.0, auth=BearerAuth(credential) if credential else None)

    @classmethod
    def from_spec(cls, spec: FleetSpec, env: ActuatorEnv) -> Actuator:
        return cls(spec, env)

    async def current(self, pool: PoolSpec) -> FleetView:
        if not self._started:
            await self.adopt()
        self._reap()
        live = [a for a in self.agents.values() if a.pool == pool.name and not a.stopping]
        return FleetView(len(live), tuple(a.replica for a in live), {a.replica: a.agent_url for a in live})

    async def adopt(self) -> list[str]:
        """Take over the agents the state file lists that still run (see the module docstring); returns their
        replica ids. Runs once, before the first `current`; a state file that cannot be read adopts nothing."""
        self._started = True
        assert self._state is not None
        try:
            records, self._next_id = self._state.load()
        except StateFileError as exc:
            log.error("%s; no agent adopted", exc)
            return []
        for record in records:
            if not check(record):
                log.info("agent %s (pid %d) is gone or is not that agent: not adopted", record.replica, record.pid)
                continue
            if not await answers(record, self._http):
                log.warning(
                    "agent %s (pid %d) does not answer on %s: adopted, load unknown until it reports",
                    record.replica,
                    record.pid,
                    record.agent_url,
                )
            self.agents[record.replica] = _Agent(record, process=None)
            self.adopted.append(record.replica)
            log.info("adopted agent %s (pid %d) on %s", record.replica, record.pid, record.agent_url)
        self._save()
        return list(self.adopted)

    def _save(self) -> None:
        if self._state is None:
            return
        try:
            self._state.save([a.record for a in self.agents.values()], self._next_id)
        except StateFileError as exc:  # the fleet keeps running; only a restart would miss these agents
            log.error("%s: a restarted control plane would not adopt the agents launched since", exc)

    def _reap(self) -> None:
        for name, agent in list(self.agents.items()):
            if not agent.alive() and not agent.stopping:
                log.warning("agent %s exited with %s", name, agent.exit_status())
                self._forget(agent)

    def _forget(self, agent: _Agent) -> None:
        self.agents.pop(agent.replica, None)
        if agent.log_file is not None:
            agent.log_file.close()
        self._save()

    async def apply(self, decision: Decision) -> None:
        if isinstance(decision, ScaleUp):
            for replica in decision.wake:
                await self._command(replica, "/wake")
            for _ in range(decision.starts):
                self.launch(decision.pool)
        elif isinstance(decision, ScaleDown):
            for replica in decision.sleep:
                await self._command(replica, "/sleep")
            for victim in decision.victims:
                agent = self.agents.get(victim)
                if agent is not None and not agent.stopping:
                    agent.stopping = True
                    agent.task = asyncio.create_task(self._stop(agent, drain=decision.drain))

    def launch(self, pool: str) -> str:
        """Start one agent for ``pool``; returns its replica id."""
        replica = f"{pool}-{self._take_id()}"
        while replica in self.agents:
            replica = f"{pool}-{self._take_id()}"
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
        if self.env.auth is not None:  # an agent runs as its control plane does: --auth none only if it does
            argv += ["--auth", self.env.auth]
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
        record = AgentRecord(replica, pool, process.pid, agent_port, engine_port)
        self.agents[replica] = _Agent(record, process, out)
        self._save()
        log.info("launched agent %s (pid %d) on port %d", replica, process.pid, agent_port)
        return replica

    def _take_id(self) -> int:
        taken, self._next_id = self._next_id, self._next_id + 1
        return taken

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

    async def _command(self, replica: str, path: str) -> None:
        """``POST path`` (``/sleep``, ``/wake``) on ``replica``'s agent; a refusal is logged (the next tick sees
        the state the agent reports and decides again)."""
        agent = self.agents.get(replica)
        if agent is None or agent.stopping:
            return
        try:
            response = await self._http.post(f"{agent.agent_url}{path}")
        except httpx.HTTPError as exc:
            log.warning("%s %s: %s", path, replica, exc)
            return
        if response.status_code >= 300:
            log.warning("%s %s refused: %s %s", path, replica, response.status_code, response.text[:200])

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
        while loop.time() < deadline and agent.alive():
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
        while agent.alive() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not agent.alive()

    @staticmethod
    def _signal(agent: _Agent, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(agent.record.pid, sig)  # the agent leads its own session: its group is its pid

    async def close(self) -> None:
        """Drain and stop every agent this actuator launched or adopted."""
        for agent in list(self.agents.values()):
            if not agent.stopping:
                agent.stopping = True
                agent.task = asyncio.create_task(self._stop(agent, drain=True))
        tasks = [a.task for a in list(self.agents.values()) if a.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.aclose()
