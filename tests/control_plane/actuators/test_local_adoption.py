"""Local actuator restarts: a new actuator over the same state dir adopts the agent the last one launched (a real
agent and simulator), leaves processes that are not that agent alone, and drains the adopted agent like its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from control_plane.actuators import ActuatorEnv
from control_plane.actuators.local import LocalActuator
from control_plane.actuators.local_state import AgentRecord, AgentStateFile, pid_alive
from control_plane.scaling.decisions import ScaleDown
from fleet.protocol.ports import free_port
from fleet.spec.loader import load_spec
from tests.support.stacks import write_stack
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.slow


async def test_a_new_actuator_adopts_the_last_ones_agent_and_drains_it(tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "Pulumi.agenttest.yaml", "local-sim", **{"pools.0.drain.propagationSeconds": 0.2})
    spec = load_spec(str(stack)).spec
    pool = spec.pools[0]
    env = ActuatorEnv(
        stack=str(stack), control_plane_url=f"http://127.0.0.1:{free_port()}", auth="none", state_dir=tmp_path
    )
    stranger = subprocess.Popen(["sleep", "60"])  # a recorded pid that now belongs to another program
    gone = subprocess.Popen(["true"])
    gone.wait()
    first = LocalActuator(spec, env)
    second: LocalActuator | None = None
    try:
        assert (await first.current(pool)).replicas == ()
        replica = first.launch(pool.name)
        [launched] = [a for a in first.agents.values()]
        assert launched.process is not None
        async with httpx.AsyncClient(timeout=2) as http:

            async def answering() -> bool:
                return (await http.get(f"{launched.agent_url}/status")).json()["replica"] == replica

            await async_wait_for(answering, timeout_s=20, what=f"agent {replica} answering")
        state = AgentStateFile(tmp_path)
        records, next_id = state.load()
        assert [r.replica for r in records] == [replica] and next_id == 2
        strangers = [
            AgentRecord("qwen-7b-8", pool.name, stranger.pid, free_port(), free_port()),
            AgentRecord("qwen-7b-9", pool.name, gone.pid, free_port(), free_port()),
        ]
        state.save([*records, *strangers], next_id=10)

        # The first actuator "dies" (it is never closed); a second one starts over the same state dir.
        second = LocalActuator(spec, env)
        view = await second.current(pool)
        assert view.replicas == (replica,) and second.adopted == [replica]
        assert pid_alive(stranger.pid)  # not adopted, not signalled
        doc = json.loads((tmp_path / "local-agents.json").read_text())
        assert [a["replica"] for a in doc["agents"]] == [replica] and doc["next_id"] == 10

        down = ScaleDown(pool.name, current=1, target=0, reason="test", at=0.0, victims=(replica,))
        await second.apply(down)
        assert (await second.current(pool)).replicas == ()  # leaving at once: no longer counted
        process = launched.process
        await async_wait_for(lambda: process.poll() is not None, timeout_s=20, what=f"agent {replica} to exit")
        assert process.returncode == 0  # drained: the agent stopped its engine and exited 0
        await async_wait_for(
            lambda: json.loads((tmp_path / "local-agents.json").read_text())["agents"] == [],
            timeout_s=5,
            what="the drained agent forgotten in the state file",
        )
    finally:
        if second is not None:
            await second.close()
        await first.close()  # stops whatever is left (nothing, when the test passed)
        stranger.kill()
        stranger.wait()
