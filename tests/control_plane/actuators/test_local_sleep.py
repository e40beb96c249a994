"""Local actuator and sleep mode, with a real agent and simulator: a scale-down's sleeper sleeps and keeps its
process, and a scale-up wakes it, serving again within its calibrated wake time, instead of launching a replica."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from control_plane.actuators import ActuatorEnv
from control_plane.actuators.local import LocalActuator
from control_plane.scaling.decisions import ScaleDown, ScaleUp
from engine_sim.sleep import WakeTiming
from fleet.capacity.catalog import MODELS
from fleet.protocol.ports import free_port
from fleet.spec.loader import load_spec
from tests.support.stacks import write_stack
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.slow

REPORT_INTERVAL_S = 1.0
WAKE_S = WakeTiming(MODELS["Qwen/Qwen2.5-7B-Instruct"].parameters * 2, 22.8e9).move_s(copies_weights=True)


async def test_the_local_actuator_sleeps_a_scale_down_victim_and_wakes_it_on_scale_up(tmp_path: Path) -> None:
    stack = write_stack(
        tmp_path / "Pulumi.agenttest.yaml",
        "local-sim",
        **{"pools.0.engine.sleepMode": True, "pools.0.drain.propagationSeconds": 0.2},
    )
    spec = load_spec(str(stack)).spec
    pool = spec.pools[0]
    env = ActuatorEnv(
        stack=str(stack), control_plane_url=f"http://127.0.0.1:{free_port()}", auth="none", log_dir=tmp_path
    )
    actuator = LocalActuator(spec, env)
    try:
        replica = actuator.launch(pool.name)
        url = actuator.agents[replica].agent_url
        async with httpx.AsyncClient(timeout=2, trust_env=False) as http:

            async def state() -> str:
                return str((await http.get(f"{url}/status")).json()["state"])

            async def ready() -> bool:
                return await state() == "ready"

            await async_wait_for(ready, timeout_s=40, what="ready")
            pid = (await http.get(f"{url}/status")).json()["engine_pid"]
            await actuator.apply(ScaleDown(pool.name, 1, 0, "test", 0.0, sleep=(replica,)))
            assert await state() == "sleeping"
            engine = (await http.get(f"{url}/status")).json()["engine_url"]

            async def engine_slept() -> bool:
                # The first sleep has finished (its duration is observed once the weights are in host memory).
                metrics = (await http.get(f"{engine}/metrics")).text
                return 'vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"} 1.0' in metrics

            await async_wait_for(engine_slept, timeout_s=20, what="engine asleep")
            started = time.monotonic()
            await actuator.apply(ScaleUp(pool.name, 0, 1, "test", 0.0, wake=(replica,)))
            await async_wait_for(ready, timeout_s=10, interval_s=0.02, what="ready after the wake")
            woke_s = time.monotonic() - started
            after = (await http.get(f"{url}/status")).json()
        assert list(actuator.agents) == [replica]  # woken, not launched
        assert after["engine_pid"] == pid and after["restarts"] == 0
        assert WAKE_S <= woke_s <= WAKE_S + REPORT_INTERVAL_S, (woke_s, WAKE_S)
    finally:
        await actuator.close()
