"""Three gateway processes in front of three simulators that publish their KV-cache events: each gateway keeps its
own index from the events, and all three send a long shared prefix to the replica that holds it. Under the
``least-work`` picker a gateway also spreads concurrent cold prompts by the prefill it has queued on each replica.

The gateways share nothing: each subscribes to every simulator's event socket and tokenizes prompts with the
pool's tokenizer folder (the shipped one), as the simulators do. When a replica's engine restarts its entries
leave every index within one report interval. When only its event stream is cut (a TCP relay closed while the
engine serves), the metric says so, its blocks leave the index and routing falls back to the load scorers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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

    def __init__(self, procs: Procs, index: int, time_scale: float = 50.0) -> None:
        self.procs, self.index, self.time_scale = procs, index, time_scale
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
        argv = sim_args("--tokenizer", TOKENIZER, "--kv-events-config", json.dumps(config), time_scale=self.time_scale)
        argv[argv.index("--port") + 1] = str(self.port)
        # VLLM_SERVER_DEV_MODE=1 serves /reset_prefix_cache (`subscribed` clears the warm-up's blocks with it).
        proc = self.procs.start(argv, name=f"sim-{self.index}", env={"VLLM_SERVER_DEV_MODE": "1"})
        proc.wait_url("API server")
        return proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _chat(
    session: aiohttp.ClientSession, gateway: Proc, question: str, system: str = SYSTEM, max_tokens: int = 2
) -> str:
    body = {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    body["max_tokens"] = max_tokens
    async with session.post(gateway.url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-llmfleet-replica"]


def _series(gateway: Proc, name: str) -> dict[str, float]:
    """The pool qwen-7b's samples of ``name`` by their state label (or the pool's name where there is none)."""
    samples = promtext.parse(httpx.get(admin_url(gateway) + "/metrics", timeout=3.0).text)[name]
    return {s.labels.get("state", "qwen-7b"): s.value for s in samples if s.labels.get("pool") == "qwen-7b"}


async def subscribed(session: aiohttp.ClientSession, replicas: list[Replica], gateways: list[Proc]) -> None:
    """Until every gateway indexes a block of every replica: a SUB socket's subscription reaches the publisher a
    moment after it connects, and a PUB socket drops what it publishes before (ZMQ's slow joiner). Each replica
    serves new warm-up prompts until every index grows, then clears its cache, so the test starts from empty
    indexes."""
    blocks = "llmfleet_gateway_kv_index_blocks"
    for r in replicas:
        before = [_series(g, blocks)["qwen-7b"] for g in gateways]
        deadline = asyncio.get_running_loop().time() + 30.0  # a busy two-core machine: events take their time
        attempt = 0
        while any(_series(g, blocks)["qwen-7b"] <= b for g, b in zip(gateways, before, strict=True)):
            assert asyncio.get_running_loop().time() < deadline, f"no gateway subscription to {r.id} took effect"
            # A new prompt each time: the engine announces a block once, when it stores it, so resending a prompt
            # whose events the slow joiner dropped would publish nothing and never reach the index.
            attempt += 1
            body = {"model": MODEL, "prompt": f"Warm-up {attempt} of {r.id}. " * 16, "max_tokens": 1}
            async with session.post(r.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
            await asyncio.sleep(0.05)
    for r in replicas:
        async with session.post(r.url + "/reset_prefix_cache") as resp:
            assert resp.status == 200 and (await resp.json())["success"], await resp.text()
        # An idle engine publishes nothing, its AllBlocksCleared included (as vLLM): a prompt shorter than a
        # block, which caches nothing, makes it step and publish.
        async with session.post(
            r.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}
        ) as resp:
            assert resp.status == 200, await resp.text()
    await _until(lambda: all(_series(g, blocks)["qwen-7b"] == 0 for g in gateways), "the warm-up's blocks cleared")


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
        await subscribed(session, replicas, gateways)
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
        # Served again (each _chat asserts a 200), by replicas of the pool the load scorers and fresh events chose.
        assert landed <= {r.id for r in replicas}


class Relay:
    """A TCP relay between the gateway and one replica's event socket, to cut the stream while the engine serves."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Relay:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def cut(self) -> None:
        """Stop accepting and close every relayed connection: the subscriber sees its peer go away."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()

    async def close(self) -> None:
        self.cut()
        assert self.server is not None
        await self.server.wait_closed()


async def test_a_cut_event_stream_leaves_its_replica_to_the_load_scorers_and_the_metric_says_so(
    procs: Procs, tmp_path: Path
) -> None:
    replicas = [Replica(procs, i) for i in range(2)]
    relays = [await Relay(r.kv_port).start() for r in replicas]
    overrides = {"gateway.routing": ROUTING, "pools.0.engine.tokenizer": TOKENIZER}
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **overrides)
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--admin-port", "0", "--no-access-log", "--seed", "1"]
    for r, relay in zip(replicas, relays, strict=True):
        argv += ["--replica", r.url, "--kv-events", f"tcp://127.0.0.1:{relay.port}"]
    try:
        gateway = procs.start(argv, name="gateway")
        gateway.wait_url("listening on")
        streams = "llmfleet_gateway_kv_event_streams"
        await _until(lambda: _series(gateway, streams)["up"] == 2, "streams up")
        async with aiohttp.ClientSession() as session:
            await subscribed(session, replicas, [gateway])  # ZMQ's slow joiner, through the relays too
            holder = await _chat(session, gateway, "What is a neap tide?")
            await _until(lambda: _series(gateway, "llmfleet_gateway_kv_index_blocks")["qwen-7b"] > 0, "blocks indexed")
            assert await _chat(session, gateway, "And a king tide?") == holder
            hits = _series(gateway, "llmfleet_gateway_kv_hit_blocks_total")["qwen-7b"]
            relays[[r.id for r in replicas].index(holder)].cut()
            await _until(lambda: _series(gateway, streams)["down"] == 1, "the cut stream counted down")
            assert _series(gateway, "llmfleet_gateway_kv_index_blocks")["qwen-7b"] == 0  # no longer vouched for
            # The engine still serves, but its blocks no longer count and no other replica holds the prefix yet: the
            # load scorers choose, and the gateway predicts no hit.
            await _chat(session, gateway, "Question after the cut?")
            assert _series(gateway, "llmfleet_gateway_kv_hit_blocks_total")["qwen-7b"] == hits
    finally:
        procs.close()  # the gateway first: its sockets close before the relays'
        for relay in relays:
            await relay.close()


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """`_wait` without blocking this test's event loop (the relays run on it)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_least_work_spreads_concurrent_cold_prompts_evenly_and_sends_a_held_prefix_to_its_holder(
    procs: Procs, tmp_path: Path
) -> None:
    # Engines in real time: nine requests of 200 tokens each stay open while all nine are routed.
    replicas = [Replica(procs, i, time_scale=1.0) for i in range(3)]
    routing = {"scrapeIntervalS": 0.2, "scorers": [{"name": "kv-cache"}], "picker": {"name": "least-work"}}
    overrides = {"gateway.routing": routing, "pools.0.engine.tokenizer": TOKENIZER}
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **overrides)
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--admin-port", "0", "--no-access-log", "--seed", "1"]
    for r in replicas:
        argv += ["--replica", r.url, "--kv-events", f"tcp://127.0.0.1:{r.kv_port}"]
    gateway = procs.start(argv, name="gateway")
    gateway.wait_url("listening on")
    await _until(lambda: _series(gateway, "llmfleet_gateway_kv_event_streams")["up"] == 3, "streams up")
    async with aiohttp.ClientSession() as session:
        await subscribed(session, replicas, [gateway])
        # Nine prompts of about one length that share no block: each goes where the least prefill is queued, three
        # each (by request counts alone, or at random, 3-3-3 would be one outcome in twelve).
        cold = [f"Log {i}: " + f"entry {i} reads {i * 7} knots. " * 40 for i in range(9)]
        landed = await asyncio.gather(*(_chat(session, gateway, "Sum it up.", c, max_tokens=200) for c in cold))
        assert sorted(collections.Counter(landed).values()) == [3, 3, 3], landed
        # All answered and closed: the gateway's counts, as it exports them, are back to nothing on every replica.
        text = httpx.get(admin_url(gateway) + "/metrics", timeout=3.0).text
        counts = promtext.parse(text)
        for name in ("llmfleet_gateway_prefill_tokens", "llmfleet_gateway_context_tokens"):
            assert {s.labels["replica"]: s.value for s in counts[name]} == {r.id: 0.0 for r in replicas}, name
        holder = await _chat(session, gateway, "What is a spring tide?")
        await _until(lambda: _series(gateway, "llmfleet_gateway_kv_index_blocks")["qwen-7b"] > 0, "blocks indexed")
        for i in range(4):  # its queue is empty again: the held prompt costs it least
            assert await _chat(session, gateway, f"And question {i}?") == holder
