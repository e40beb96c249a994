"""Two gateway processes in front of the same three simulators route each conversation to the same replica.

The gateways share nothing (no Redis, no index): `rendezvous-affinity` ranks replicas by a hash of the
conversation's leading prompt blocks and the replica's name, so both compute the same answer. The simulators'
own request counters confirm that the replica named in ``x-llmfleet-replica`` is the one that served.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import aiohttp

from fleet.protocol import promtext
from gateway.endpoints import static_replica_id
from tests.gateway.conftest import SimFactory
from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL, write_stack

HEADERS = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
ROUTING: dict[str, Any] = {
    "scrapeIntervalS": 0.2,
    "scorers": [
        {"name": "queue-depth", "weight": 2},
        {"name": "kv-usage", "weight": 1},
        {"name": "rendezvous-affinity", "weight": 5},  # 5 x (1 - 0.25) > 2 + 1: the winner wins every draw
    ],
    "picker": {"name": "p2c"},
}


def _turns(i: int) -> list[list[dict[str, str]]]:
    """Two turns of conversation ``i``: the second repeats the first and adds to it (prefix caching's case)."""
    first = [{"role": "user", "content": f"Conversation {i}. " + "Tell me about the weather at sea. " * 32}]
    second = [*first, {"role": "assistant", "content": "Calm."}, {"role": "user", "content": "And tomorrow?"}]
    return [first, second]


async def _send(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> str:
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4})
    async with session.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-llmfleet-replica"]


async def _served(session: aiohttp.ClientSession, sim: Proc) -> float:
    async with session.get(sim.url + "/metrics") as resp:
        samples = promtext.parse(await resp.text())
    return sum(s.value for s in samples["vllm:request_success_total"])


async def test_a_conversation_lands_on_the_same_replica_through_either_gateway(
    sims: SimFactory, procs: Procs, tmp_path: Path
) -> None:
    replicas = sims([], [], [])
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **{"gateway.replicas": 2, "gateway.routing": ROUTING})
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--no-access-log"]
    for sim in replicas:
        argv += ["--replica", sim.url]
    gateways = [procs.start([*argv, "--seed", str(seed)], name=f"gateway-{seed}") for seed in (1, 2)]
    for gateway in gateways:
        gateway.wait_url("listening on")

    landed: dict[int, set[str]] = collections.defaultdict(set)
    named: collections.Counter[str] = collections.Counter()
    async with aiohttp.ClientSession() as session:
        for i in range(8):
            for turn in _turns(i):
                for gateway in gateways:  # every turn through both gateways
                    replica = await _send(session, gateway.url, turn)
                    landed[i].add(replica)
                    named[replica] += 1
        served = {static_replica_id("qwen-7b", n): await _served(session, sim) for n, sim in enumerate(replicas)}
    assert all(len(where) == 1 for where in landed.values()), dict(landed)
    assert len(set().union(*landed.values())) >= 2  # the conversations spread over the replicas
    assert {rid: float(named[rid]) for rid in served} == served  # the named replica is the one that served
