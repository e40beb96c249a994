"""A control plane killed mid-load and restarted on the same port and state dir: the fleet does not notice.

The local fleet as ``llmfleet up`` wires it (control plane with the local actuator launching agents that launch
simulators, a gateway discovering replicas from the control plane, one fleet secret), started part by part so
the test can SIGKILL the control plane's whole process group under light load and start it again. Then:

* the agent survived and was adopted: the same agent process, no duplicate (the pool's bounds are 1..1, so a
  control plane that launched its own would run two);
* the restart lease granted before the kill is still held with the same expiry, and a second replica is refused;
* no request failed, and requests were served while no control plane ran (the gateway kept its replicas);
* stopping the new control plane drains and stops the adopted agent, as its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.actuators.local_state import pid_alive
from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, ENGINE_API_KEY_ENV
from fleet.protocol.keys import DEMO_API_KEY
from fleet.protocol.ports import free_port
from llmfleet.local.load import LoadStats, run_load
from llmfleet.local.procs import Child
from tests.llmfleet.local.conftest import FAST, fast_stack
from tests.support.procs import Proc
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-7b-instruct"
POOL = "qwen-7b"
SECRET = "restart-test-fleet-secret"
ENV = {CONTROL_TOKEN_ENV: SECRET, ENGINE_API_KEY_ENV: "restart-test-engine-key"}


def agent_pids(stack: Path) -> dict[str, int]:
    """replica -> pid of every agent process started with ``stack``, whoever its parent is now."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not pid_alive(int(entry.name)):
            continue
        with contextlib.suppress(OSError):
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0")]
            if "agent" in argv and str(stack) in argv and "--replica" in argv:
                found[argv[argv.index("--replica") + 1]] = int(entry.name)
    return found


def start_control_plane(stack: Path, port: int, logs: Path) -> Proc:
    argv = ["control-plane", "--stack", str(stack), "--port", str(port), "--log-dir", str(logs)]
    return Proc(Child("control-plane", argv, logs / "control-plane.log", env=ENV), f"http://127.0.0.1:{port}")


async def test_a_killed_control_plane_restarts_without_duplicates_lost_leases_or_failed_requests(
    tmp_path: Path,
) -> None:
    # A busy machine (two cores, other tests) can take longer than FAST's 3 s cold start.
    pools = [{**FAST["pools"][0], "replicas": {"min": 1, "max": 1}, "coldStartSeconds": 20}]
    stack = fast_stack(tmp_path, pools=pools, **{"gateway.adminPort": free_port()})
    logs, cp_port, gw_port = tmp_path / "logs", free_port(), free_port()
    cp = start_control_plane(stack, cp_port, logs)
    gw_argv = ["gateway", "--stack", str(stack), "--port", str(gw_port), "--control-plane", cp.url]
    gateway = Proc(Child("gateway", gw_argv, logs / "gateway.log", env=ENV), f"http://127.0.0.1:{gw_port}")
    procs = [cp, gateway]
    agents: dict[str, int] = {}
    stats, stop = LoadStats(), asyncio.Event()
    load: asyncio.Task[LoadStats] | None = None

    def diagnostics() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(logs.glob("*.log")))

    async def until(predicate: Any, what: str, timeout_s: float = 30) -> Any:
        return await async_wait_for(
            predicate,
            timeout_s=timeout_s,
            what=what,
            interval_s=0.1,
            diagnostics=diagnostics,
            ignore=(httpx.HTTPError,),
        )

    try:
        async with httpx.AsyncClient(
            base_url=cp.url, timeout=2, headers={"Authorization": f"Bearer agent:{SECRET}"}
        ) as http:

            async def ready() -> int | None:
                [pool] = (await http.get("/v1/pools")).json()["pools"]
                return pool["ready"] if pool["ready"] == 1 else None

            await until(ready, "the replica ready")
            await asyncio.to_thread(gateway.wait_log, "llmfleet gateway listening on", timeout_s=20)

            async def routed() -> bool:
                body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
                headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
                answer = await http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)
                return answer.status_code == 200

            await until(routed, "a completion through the gateway")
            agents = agent_pids(stack)
            [holder] = agents
            other = f"{POOL}-other"  # a second replica of the pool asking for a lease

            load = asyncio.create_task(
                run_load(
                    gateway.url, DEMO_API_KEY, MODEL, 3, 120, prompt_tokens=32, output_tokens=16, stop=stop, stats=stats
                )
            )
            await until(lambda: stats.ok >= 3, "requests served before the kill")
            lease = await http.post("/v1/leases/restart", json={"pool": POOL, "replica": holder, "ttl_s": 300})
            assert lease.status_code == 200, lease.text
            expires_at = lease.json()["expires_at"]

            await asyncio.to_thread(cp.kill)  # SIGKILL to the control plane's whole process group
            assert all(pid_alive(pid) for pid in agents.values())  # agents run in sessions of their own
            served_before = stats.ok
            await until(lambda: stats.ok >= served_before + 2, "requests served with no control plane")
            assert stats.errors == {}, stats.errors

            cp = start_control_plane(stack, cp_port, logs)  # same port, same state dir
            procs.append(cp)
            # What gateways are told from the first answer on: "not yet" (503) or the replica, never an empty list.
            answers: list[tuple[int, list[str]]] = []

            async def discovered() -> bool:
                listing = await http.get(f"/v1/pools/{POOL}/replicas")
                fresh = [] if listing.status_code != 200 else listing.json()["replicas"]
                answers.append((listing.status_code, sorted(r["replica"] for r in fresh if not r["stale"])))
                return listing.status_code == 200

            await until(discovered, "discovery answered by the restarted control plane")
            assert {status for status, _ in answers} <= {200, 503} and answers[-1] == (200, [holder]), answers
            leases = (await http.get("/v1/leases")).json()
            assert leases["holders"] == {POOL: {holder: expires_at}}
            # The other replica is starting on this host (its engine not up): its agent has reported it.
            report = {**(await http.get(f"/v1/pools/{POOL}/replicas")).json()["replicas"][0]["last_report"]}
            report.update(replica=other, state="starting", engine_url="http://127.0.0.1:9", ts=time.time())
            assert (await http.post("/v1/reports", json=report)).status_code == 200
            refused = await http.post("/v1/leases/restart", json={"pool": POOL, "replica": other, "ttl_s": 300})
            assert refused.status_code == 409, refused.text

            async def settled() -> list[dict[str, Any]] | None:
                decisions = (await http.get("/v1/decisions")).json()["decisions"]
                return decisions if decisions and not decisions[-1]["reason"].startswith("starting") else None

            decisions = await until(settled, "the restarted control plane deciding again")
            await until(ready, "the replica ready on the restarted control plane")
            assert agent_pids(stack) == agents  # the same processes: adopted, none launched twice
            assert [d for d in decisions if d["kind"] != "hold"] == []
            await asyncio.sleep(1.0)  # a few more ticks with the load still running
            assert agent_pids(stack) == agents

            stop.set()
            await load
            assert stats.errors == {} and stats.ok == stats.sent > served_before + 2, stats.line()

        gateway.stop(timeout_s=20)
        assert cp.stop(timeout_s=30) == 0  # SIGTERM: the restarted control plane drains the adopted agent
        assert not any(pid_alive(pid) for pid in agents.values())
    finally:
        stop.set()
        if load is not None:
            with contextlib.suppress(Exception):
                await load
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()
        for pid in agent_pids(stack).values():  # never leave an agent (and its engine) behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
