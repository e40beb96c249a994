"""Routing through a real gateway over real simulator processes: p2c vs random, session stickiness.

Stickiness is checked with ``max-score`` and with the prod stack's own routing block (p2c).
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import aiohttp
import pytest

from gateway.endpoints import static_replica_id
from tests.gateway.builders import P2C_SESSION_ROUTING
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}


async def _send(session: aiohttp.ClientSession, url: str, headers: dict[str, str], max_tokens: int = 16) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there."}], "max_tokens": max_tokens}
    async with session.post(url + "/v1/chat/completions", data=json.dumps(body), headers=headers) as resp:
        await resp.read()
        assert resp.status == 200
        return resp.headers["x-llmfleet-replica"]


async def _spread(url: str, requests: int, concurrency: int) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            queue.get_nowait()
            counts[await _send(session, url, GOLD)] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return counts


async def test_p2c_sends_fewer_requests_than_random_to_the_busiest_replica(sims: SimFactory) -> None:
    # One replica is 100x slower: under the same concurrent load its requests pile up. Slower than the HTTP hops a
    # busy machine adds to every request (at 40x those made the fast replicas look slow too, and p2c's share rose).
    slow, fast1, fast2 = sims(["--fault-slowdown", "100"], [], [], time_scale=20.0)
    busy_id = static_replica_id("qwen-7b", 0)  # the first static URL; the header names it, never its address
    shares: dict[str, float] = {}
    for picker in ("p2c", "random"):
        routing: dict[str, Any] = {
            "scrapeIntervalS": 0.2,
            "scorers": [{"name": "queue-depth", "weight": 1}, {"name": "in-flight", "weight": 1}],
            "picker": {"name": picker},
        }
        settings = settings_for([slow.url, fast1.url, fast2.url], **{"gateway.routing": routing})
        async with serve(settings) as (url, _):
            counts = await _spread(url, requests=90, concurrency=9)
        shares[picker] = counts[busy_id] / sum(counts.values())
    print("share of requests sent to the busiest replica:", shares)
    assert shares["p2c"] < shares["random"] * 0.5, shares


MAX_SCORE_ROUTING: dict[str, Any] = {
    "scrapeIntervalS": 0.2,
    "scorers": [{"name": "session-affinity", "weight": 10}, {"name": "in-flight", "weight": 1}],
    "picker": {"name": "max-score"},
}


@pytest.mark.parametrize(
    "routing", [MAX_SCORE_ROUTING, {**P2C_SESSION_ROUTING, "scrapeIntervalS": 0.2}], ids=["max-score", "p2c-session"]
)
async def test_session_sticks_to_one_replica_until_it_leaves_rotation(
    sims: SimFactory, routing: dict[str, Any]
) -> None:
    procs = sims([], [], [])
    settings = settings_for([p.url for p in procs], **{"gateway.routing": routing})
    async with serve(settings) as (url, _), aiohttp.ClientSession() as session:
        sessions = {name: {**GOLD, "x-session-id": name} for name in ("alice", "bob", "carol", "dave")}
        before = {name: {await _send(session, url, h) for _ in range(5)} for name, h in sessions.items()}
        assert all(len(replicas) == 1 for replicas in before.values()), before
        alice = next(iter(before["alice"]))
        victim = procs[[static_replica_id("qwen-7b", i) for i in range(len(procs))].index(alice)]
        victim.kill()  # alice's replica leaves: her next request is retried elsewhere and she sticks there
        after = {name: {await _send(session, url, h) for _ in range(5)} for name, h in sessions.items()}
    assert len(after["alice"]) == 1 and after["alice"] != before["alice"]
    for name in ("bob", "carol", "dave"):  # sessions on other replicas did not move
        if before[name] != before["alice"]:
            assert after[name] == before[name]
