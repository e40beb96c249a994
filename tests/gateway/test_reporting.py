"""Gateway reports: the admission queue reaches the real control plane and its decisions; a control plane that is
down costs the gateway nothing but a backoff."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleet.protocol.clock import SystemClock
from fleet.protocol.ports import free_port
from gateway.reporting import GatewayReporter, PoolTraffic
from gateway.settings import GatewaySettings
from tests.gateway.conftest import serve
from tests.support.procs import Proc
from tests.support.stacks import KEYS, spec, write_stack
from tests.support.wait import async_wait_for

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
SMALL = json.dumps({"model": "small-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
QUEUE = {"gateway.queue.timeoutS": 60}  # requests wait long enough to be seen


async def test_gateway_queue_reaches_control_plane_decisions(
    start_control_plane: Callable[[Path], Proc], tmp_path: Path
) -> None:
    # Pool "small" has min 0 and no replica: requests wait in the gateway's admission queue, where no agent sees
    # them. The gateway's reports must put them in the control plane's decision inputs, and start the pool.
    autoscaling = {"actuator": "local", "dryRun": True, "intervalS": 0.2}
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **QUEUE, autoscaling=autoscaling)
    cp = start_control_plane(stack)
    settings = GatewaySettings(spec=spec("gateway", **QUEUE), control_plane=cp.url, access_log=False)
    async with aiohttp.ClientSession() as session, serve(settings) as (url, gw):

        async def chat() -> int:
            async with session.post(url + "/v1/chat/completions", data=SMALL, headers=GOLD) as resp:
                await resp.read()
                return resp.status

        clients = [asyncio.create_task(chat()) for _ in range(3)]
        found: dict[str, Any] = {}

        async def decided() -> bool:
            async with session.get(cp.url + "/v1/decisions", params={"pool": "small"}) as resp:
                decisions = (await resp.json())["decisions"]
            for d in decisions:
                if d["inputs"].get("gateway_waiting") == 3:
                    found.update(d)
                    return True
            return False

        try:

            async def queued() -> bool:
                return gw.admission["small"].waiting == 3

            await async_wait_for(queued, timeout_s=20, interval_s=0.1, what="three requests queued")
            await async_wait_for(decided, timeout_s=20, interval_s=0.1, what="a decision on the queue")
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
        inputs = found["inputs"]
        assert inputs["gateways_stale"] == 0 and inputs["request_rate"] > 0
        assert found["kind"] == "scale-up" and found["target"] >= 1  # started on the gateway's queue alone
        assert "gateway" in found["reason"]


async def test_each_gateway_learns_how_many_gateways_report_to_the_control_plane(
    start_control_plane: Callable[[Path], Proc], tmp_path: Path
) -> None:
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **QUEUE)
    cp = start_control_plane(stack)
    settings = GatewaySettings(spec=spec("gateway", **QUEUE), access_log=False)  # reports only through these:
    async with aiohttp.ClientSession() as session, serve(settings) as (_, gw):
        heard: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        reporters = {
            name: GatewayReporter(
                cp.url,
                session,
                gw.admission,
                gw.traffic,
                SystemClock(),
                gateway_id=f"gw-{name}",
                on_peers=heard[name].append,
            )
            for name in heard
        }
        for name in ("a", "b", "c"):
            assert await reporters[name].push_once() is True
        assert await reporters["a"].push_once() is True
    # Each answer counts the gateways that have reported (and are not stale) by then, this one included.
    assert heard["a"][0] == 1 and heard["b"][0] == 2 and heard["c"][0] == 3
    assert heard["a"][-1] == 3


async def test_control_plane_down_backs_off_and_keeps_serving() -> None:
    port = free_port()  # nothing listens here
    settings = GatewaySettings(
        spec=spec("gateway", **QUEUE), control_plane=f"http://127.0.0.1:{port}", access_log=False
    )
    async with aiohttp.ClientSession() as session, serve(settings) as (url, gw):
        reporter = GatewayReporter(
            f"http://127.0.0.1:{port}", session, gw.admission, gw.traffic, SystemClock(), 0.5, max_backoff_s=3.0
        )
        delays = []
        for _ in range(4):
            assert await reporter.push_once() is False
            delays.append(reporter.backoff.delay())
        assert delays == [0.5, 1.0, 2.0, 3.0]  # the interval, doubled per failed round, capped
        async with session.get(url + "/healthz") as resp:
            assert resp.status == 200  # the gateway serves while its reports fail


@pytest.mark.parametrize(
    ("samples", "now", "counts", "window_s", "expected"),
    [
        pytest.param([(0.0, 0, 0)], 0.0, (5, 5), 10.0, (0.0, 0.0, 0.0), id="no-time-elapsed-no-rate"),
        pytest.param([(0.0, 0, 0)], 2.0, (10, 6), 10.0, (5.0, 3.0, 2.0), id="since-start"),
        pytest.param([(0.0, 0, 0), (5.0, 50, 50)], 20.0, (110, 90), 10.0, (4.0, 8 / 3, 15.0), id="old-sample-kept"),
        pytest.param(
            [(0.0, 0, 0), (5.0, 50, 50), (12.0, 60, 60)],
            20.0,
            (100, 90),
            10.0,
            (10 / 3, 8 / 3, 15.0),
            id="window-slides",
        ),
    ],
)
def test_pool_traffic_rates_over_a_sliding_window(
    samples: list[tuple[float, int, int]],
    now: float,
    counts: tuple[int, int],
    window_s: float,
    expected: tuple[float, float, float],
) -> None:
    traffic = PoolTraffic(arrived=counts[0], admitted=counts[1], samples=deque(samples))
    assert traffic.rates(now, window_s) == pytest.approx(expected)
