"""Admission under a real burst: a low-priority tenant's burst does not push a high-priority tenant's queue wait
past its SLO."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from fleet.protocol.promtext import histogram_buckets, histogram_quantile, parse
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import DELETE, KEYS, MODEL


async def _send(session: aiohttp.ClientSession, url: str, tenant: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 20}
    headers = {"Authorization": f"Bearer {KEYS[tenant]}", "Content-Type": "application/json"}
    async with session.post(url + "/v1/chat/completions", data=json.dumps(body), headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_low_priority_burst_keeps_high_priority_queue_wait_within_slo(sims: SimFactory) -> None:
    (sim,) = sims([], time_scale=5.0, max_num_seqs=2)
    settings = settings_for(
        [sim.url],
        **{
            "pools.0.engine": {"kind": "sim", "maxNumSeqs": 2},
            "pools.1": DELETE,
            "gateway.queue": {"perReplicaThreshold": 0, "maxWaiting": 500, "timeoutS": 60},
        },
    )
    slo_s = settings.spec.pool("qwen-7b").slo.ttft_p99_ms / 1000
    async with serve(settings) as (url, gw):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            burst = [asyncio.create_task(_send(session, url, "bronze")) for _ in range(80)]  # priority 1
            await asyncio.sleep(0.2)
            high: list[int] = []
            for _ in range(15):  # priority 8, arriving while the burst waits
                high.append(await _send(session, url, "gold"))
                await asyncio.sleep(0.05)
            low = await asyncio.gather(*burst)
        samples = parse(gw.metrics.render().decode())
    assert set(high) == {200} and set(low) == {200}
    name = "llmfleet_gateway_queue_wait_seconds"
    p99_high = histogram_quantile(histogram_buckets(samples, name, {"priority": "8"}), 0.99)
    p99_low = histogram_quantile(histogram_buckets(samples, name, {"priority": "1"}), 0.99)
    assert p99_high is not None and p99_low is not None
    assert p99_high < slo_s < p99_low, (p99_high, p99_low)
