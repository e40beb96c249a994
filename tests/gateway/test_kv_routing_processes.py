"""Three gateway processes in front of three simulators that publish their KV-cache events: each gateway keeps its
own index from the events, and all three send a long shared prefix to the replica that holds it.

The gateways share nothing: each subscribes to every simulator's event socket and tokenizes prompts with the
pool's tokenizer folder (the shipped one), as the simulators do. When a replica's engine restarts its entries
leave every index within one report interval; while its stream is cut, the metric says so and routing falls back
to the load scorers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from fleet.protocol import promtext
from fleet.protocol.ports import free_port
from gateway.endpoints import static_replica_id
from tests.gateway.conftest import admin_url, sim_args
from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import wait_for

TOKENIZER = "models/llmfleet-tiny-tokenizer"
HEADERS = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
ROUTING: dict[str, Any] = {
    "scrapeIntervalS": 0.2,
    "scorers": [{"name": "queue-depth", "weight": 1}, {"name": "kv-cache", "weight": 3}],
    "picker": {"name": "p2c"},
}
SYSTEM = "You answer questions about the sea, its weather, its tides and the ships that cross it. " * 24
REPORT_S = 1.0  # the stack's controlPlane.reportIntervalS (its default)


class Replica:
    """One simulator with fixed HTTP and event ports, so a restart comes back where the gateways look."""

    def __init__(self, procs: Procs, index: int) -> None:
        self.procs, self.index = procs, index
        self.port, self.kv_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        self.id = static_replica_id("qwen-7b", index)
        self.proc = self.start()

    def start(self) -> Proc:
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.kv_port}",
            "topic": f"kv@{self.id}@{MODEL}",
        }
        argv = sim_args("--tokenizer", TOKENIZER, "--kv-events-config", json.dumps(config))
        argv[argv.index("--port") + 1] = str(self.port)
        proc = self.procs.start(argv, name=f"sim-{self.index}")
        proc.wait_url("API server")
        return proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _chat(session: aiohttp.ClientSession, gateway: Proc, question: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    async with session.post(gateway.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, headers=HEADERS) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-llmfleet-replica"]


def _series(gateway: Proc, name: str) -> dict[str, float]:
    """The pool qwen-7b's samples of ``name`` by their state label (or the pool's name where there is none)."""
    samples = promtext.parse(httpx.get(admin_url(gateway) + "/metrics", timeout=3.0).text)[name]
    return {s.labels.get("state", "qwen-7b"): s.value for s in samples if s.labels.get("pool") == "qwen-7b"}


def _kv_lines(gateway: Proc) -> str:
    text = httpx.get(admin_url(gateway) + "/metrics", timeout=3.0).text
    return "\n".join(line for line in text.splitlines() if "kv_" in line and not line.startswith("#"))


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 10.0, gateway: Proc | None = None) -> None:
    diagnostics = None if gateway is None else (lambda: _kv_lines(gateway))
    wait_for(lambda: True if check() else None, timeout_s=timeout_s, what=what, diagnostics=diagnostics)


async def test_three_gateways_send_a_shared_prefix_to_its_holder_and_forget_a_restarted_one(
    procs: Procs, tmp_path: Path
) -> None:
    replicas = [Replica(procs, i) for i in range(3)]
    overrides = {"gateway.replicas": 3, "gateway.routing": ROUTING, "pools.0.engine.tokenizer": TOKENIZER}
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **overrides)
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--admin-port", "0", "--no-access-log"]
    for r in replicas:
        argv += ["--replica", r.url, "--kv-events", f"tcp://127.0.0.1:{r.kv_port}"]
    gateways = [procs.start([*argv, "--seed", str(seed)], name=f"gateway-{seed}") for seed in (1, 2, 3)]
    for gateway in gateways:
        gateway.wait_url("listening on")
    for gateway in gateways:
        _wait(lambda g=gateway: _series(g, "llmfleet_gateway_kv_event_streams")["up"] == 3, "streams up", 10, gateway)

    async with aiohttp.ClientSession() as session:
        holder = await _chat(session, gateways[0], "What is a spring tide?")
        for gateway in gateways:  # every index learns the holder's blocks from its events
            _wait(lambda g=gateway: _series(g, "llmfleet_gateway_kv_index_blocks")["qwen-7b"] > 0, "blocks indexed")
        for i, gateway in enumerate([*gateways, *gateways]):
            assert await _chat(session, gateway, f"And question {i}?") == holder
        # The predicted hits: after the first request (nothing cached), the chosen replica held nearly every block.
        hits = [_series(g, "llmfleet_gateway_kv_hit_blocks_total")["qwen-7b"] for g in gateways]
        routed = [_series(g, "llmfleet_gateway_kv_prompt_blocks_total")["qwen-7b"] for g in gateways]
        assert hits[0] <= routed[0] * 2 / 3 and all(h > 0.8 * r > 0 for h, r in zip(hits[1:], routed[1:], strict=True))

        restarted = next(r for r in replicas if r.id == holder)
        restarted.proc.kill()
        for gateway in gateways:  # the cut stream is dropped from every index, and the metric says so
            _wait(lambda g=gateway: _series(g, "llmfleet_gateway_kv_index_blocks")["qwen-7b"] == 0, "dropped", REPORT_S)
            assert _series(gateway, "llmfleet_gateway_kv_event_streams")["down"] == 1
        restarted.proc = restarted.start()
        for gateway in gateways:
            _wait(lambda g=gateway: _series(g, "llmfleet_gateway_kv_event_streams")["up"] == 3, "stream back")
        landed = {await _chat(session, gateway, "Where do tides come from?") for gateway in gateways}
        assert landed  # served again, by whichever replica the load scorers and the fresh events chose
