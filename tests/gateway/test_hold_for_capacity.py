"""From zero: requests for a pool with no replica are held (``gateway.queue.holdForCapacityS``, not the queue's
``timeoutS``), the gateway tells the control plane at once (not at its next report), and every held request is
answered once the first replica, launched for them, is ready. Real processes: the control plane with the local
actuator, its agents and simulated engines; the gateway in this event loop."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from fleet.protocol.ports import free_port
from gateway.settings import GatewaySettings
from tests.gateway.conftest import serve
from tests.support.procs import Procs
from tests.support.stacks import KEYS, spec, write_stack
from tests.support.wait import async_wait_for

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
SMALL = json.dumps({"model": "small-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
REPORT_EVERY_S = 10.0  # the gateway's regular report: "at once" must come well before it
STACK = {
    "gateway.queue.timeoutS": 1,
    "gateway.queue.holdForCapacityS": 60,
    "controlPlane.reportIntervalS": REPORT_EVERY_S,
    "controlPlane.staleAfterS": 30,
    "pools.0.replicas": {"min": 0, "max": 1},
    "pools.1.drain": {"graceSeconds": 10, "propagationSeconds": 0.5},  # the test's end drains its replica quickly
    "autoscaling": {"actuator": "local", "intervalS": 0.2},
}


async def test_requests_held_through_zero_to_one_all_succeed(procs: Procs, tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **STACK)
    argv = ["control-plane", "--stack", str(stack), "--port", str(free_port()), "--log-dir", str(tmp_path / "cp")]
    argv += ["--auth", "none"]
    cp = procs.start(argv, name="control-plane", stop_timeout_s=30)
    cp.wait_url("listening on")
    settings = GatewaySettings(spec=spec("gateway", **STACK), control_plane=cp.url, access_log=False)
    async with aiohttp.ClientSession() as session, serve(settings) as (url, gw):

        async def chat() -> tuple[int, float]:
            started = time.monotonic()
            async with session.post(url + "/v1/chat/completions", data=SMALL, headers=GOLD) as resp:
                await resp.read()
                return resp.status, time.monotonic() - started

        sent = time.time()
        clients = [asyncio.create_task(chat()) for _ in range(4)]

        async def launched() -> float | None:
            async with session.get(cp.url + "/v1/decisions", params={"pool": "small"}) as resp:
                decisions = (await resp.json())["decisions"]
            ups = [d["at"] for d in decisions if d["kind"] == "scale-up"]
            return min(ups) if ups else None

        first_up = await async_wait_for(launched, timeout_s=20, interval_s=0.1, what="a scale-up of pool small")
        results = await asyncio.wait_for(asyncio.gather(*clients), timeout=60)
    assert first_up - sent < REPORT_EVERY_S / 2, "the gateway waited for its next report to tell the control plane"
    assert [status for status, _ in results] == [200] * 4
    assert min(waited for _, waited in results) > STACK["gateway.queue.timeoutS"]  # held past the queue timeout
    assert gw.admission["small"].waiting == 0
