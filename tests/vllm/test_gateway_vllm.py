"""The gateway in front of two real vLLM engines (each started by its agent): the `openai` and `anthropic` clients'
APIs, the engines' own errors, KV-event routing from the real events, an engine SIGKILLed under 16 greedy streams
and a drain shorter than the streams under steady load.

The gateways know the engines as static replicas (``--replica``) and read their KV events (``--kv-events``): no
control plane tells them of a drain, so a draining engine's answers reach them, as they do in the race between a
drain and the next routing decision. The pool drains in 10 s (its engines' ``--shutdown-timeout`` is 5 s) for the
last test. The tests run in file order and share the engines; the SIGKILL test waits for ``r0``'s
agent to bring its engine back before the drain test takes ``r1`` away.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import msgpack
import openai
import pytest
import zmq

from engine_sim.block_hash import chain_hashes, external_hash, none_hash
from fleet.protocol.control_auth import ENGINE_API_KEY_ENV
from fleet.protocol.keys import DEMO_API_KEY
from fleet.protocol.promtext import counter_value, gauge_value, parse
from gateway.cache_salt import CacheSalts
from gateway.endpoints import static_replica_id
from tests.gateway.conftest import ADMIN_MARKER
from tests.support.procs import Proc, Procs
from tests.support.wait import async_wait_for, wait_for
from tests.vllm.conftest import HASH_SEED, SERVED, vllm_stack
from tests.vllm.engines import Replica, start_replica, wait_ready_replica
from tests.vllm.streams import Greedy, SteadyLoad

POOL = "qwen-7b"
ENGINE_KEY = "sk-engines-vllm-tier"  # the fleet's engine key: agents and gateways hold it
BLOCK = 128  # the CPU build's KV block size (it refuses 16), which the gateway must learn from the events


class Fleet:
    """Two agents with their engines and two gateways in front of them."""

    def __init__(self, replicas: list[Replica], gateways: list[Proc]) -> None:
        self.replicas, self.gateways = replicas, gateways
        self.clients: dict[int, openai.OpenAI] = {}

    def admin(self, n: int = 0) -> str:
        return self.gateways[n].logged_url(ADMIN_MARKER)

    def gateway_metrics(self, n: int = 0) -> dict[str, Any]:
        return parse(httpx.get(f"{self.admin(n)}/metrics", timeout=5).text)

    def engine_metrics(self, n: int) -> dict[str, Any]:
        return parse(httpx.get(f"{self.replicas[n].engine_url}/metrics", timeout=5).text)

    def routable(self, n: int) -> int:
        """Replicas gateway ``n`` routes to (its ``/readyz``)."""
        body = httpx.get(f"{self.admin(n)}/readyz", timeout=5).json()
        return int(body.get("routable_replicas", {}).get(POOL, 0))

    def replica_id(self, n: int) -> str:
        return static_replica_id(POOL, n)

    def openai(self, n: int = 0) -> openai.OpenAI:
        """The `openai` client of gateway ``n`` (one per gateway, closed with the fleet)."""
        if n not in self.clients:
            url = f"{self.gateways[n].url}/v1"
            self.clients[n] = openai.OpenAI(base_url=url, api_key=DEMO_API_KEY, max_retries=0, timeout=120)
        return self.clients[n]


@pytest.fixture(scope="module")
def fleet(module_procs: Procs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("stacks")
    # The replicas drain in 10 s with no propagation delay (their engines' --shutdown-timeout is 5 s): a drain cuts
    # the long streams of the last test.
    stack = vllm_stack(
        folder / "Pulumi.vllm-gw.yaml", **{"pools.0.drain": {"graceSeconds": 10, "propagationSeconds": 0}}
    )
    # One at a time: two engines starting together on two cores take minutes each. The engines' API key is the
    # fleet's: agents give it to their engines, gateways send it and derive their response ids' MAC key from it.
    env = {ENGINE_API_KEY_ENV: ENGINE_KEY}
    replicas = [start_replica(module_procs, stack, "r0", env=env), start_replica(module_procs, stack, "r1", env=env)]
    gateways = []
    for seed in (1, 2):
        argv = ["gateway", "--stack", str(stack), "--port", "0", "--seed", str(seed), "--no-access-log"]
        for replica in replicas:
            argv += ["--replica", replica.engine_url, "--kv-events", replica.kv_events]
        gateway = module_procs.start(argv, name=f"gateway-{seed}", stop_timeout_s=10, env=env)
        gateway.wait_url("listening on")
        gateways.append(gateway)
    fleet = Fleet(replicas, gateways)
    for n in range(2):
        wait_for(lambda n=n: httpx.get(f"{fleet.admin(n)}/readyz", timeout=2).status_code == 200, timeout_s=30,
                 what=f"gateway {n} ready")  # fmt: skip
    yield fleet
    for client in fleet.clients.values():
        client.close()


def test_the_openai_client_gets_chat_and_completions_whole_and_streamed(fleet: Fleet) -> None:
    client = fleet.openai()
    chat = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 8
    chunks = list(
        client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    text = client.completions.create(model=SERVED, prompt="the fleet", max_tokens=8)
    assert text.choices[0].finish_reason == "length" and text.usage and text.usage.completion_tokens == 8
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=SERVED, prompt="the fleet", max_tokens=8, stream=True, temperature=0)
        if c.choices
    )
    whole = client.completions.create(model=SERVED, prompt="the fleet", max_tokens=8, temperature=0)
    assert streamed == whole.choices[0].text  # greedy: the same text either way


def test_the_anthropic_client_gets_messages_and_count_tokens(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    client = anthropic.Anthropic(base_url=fleet.gateways[0].url, api_key=DEMO_API_KEY, max_retries=0, timeout=60)
    request.addfinalizer(client.close)
    message = client.messages.create(model=SERVED, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    with client.messages.stream(model=SERVED, max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    counted = client.messages.count_tokens(model=SERVED, messages=[{"role": "user", "content": "hi there"}])
    assert counted.input_tokens > 0


def test_a_responses_follow_up_through_a_second_gateway(fleet: Fleet) -> None:
    first = fleet.openai(0).responses.create(model=SERVED, input="remember the fleet", max_output_tokens=8)
    # The tiny model never stops by itself: its answer ends at the token limit (vLLM marks it incomplete).
    assert first.status == "incomplete" and first.output_text
    assert first.incomplete_details and first.incomplete_details.reason == "max_output_tokens"
    follow = fleet.openai(1).responses.create(model=SERVED, input="and now?", previous_response_id=first.id,
                                              max_output_tokens=8)  # fmt: skip
    assert follow.status == "incomplete" and follow.usage and first.usage
    assert follow.usage.input_tokens > first.usage.input_tokens  # the first turn came along
    assert fleet.openai(1).responses.retrieve(first.id).id == first.id


def test_the_engines_own_errors_reach_the_client_as_they_do_from_the_simulator(fleet: Fleet) -> None:
    client = fleet.openai()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=SERVED, prompt="the fleet", max_tokens=4000)
    assert "max_tokens" in str(too_many.value) or "context" in str(too_many.value)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=SERVED, prompt=" fleet" * 2100, max_tokens=4)
    assert too_long.value.status_code == 400


class KvEvents:
    """A subscriber to one engine's KV-events socket: every BlockStored it publishes."""

    def __init__(self, address: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(address)

    def until_live(self, engine_url: str, tag: str, timeout_s: float = 60.0) -> None:
        """Send the engine new full blocks until their events arrive: a SUB socket sees nothing published before
        its subscription reached the publisher."""
        headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
        deadline = time.monotonic() + timeout_s
        for i in range(1000):
            assert time.monotonic() < deadline, f"no KV event from {engine_url} in {timeout_s} s"
            prompt = f"{tag} {i}: " + " ".join(f"word{j}" for j in range(200))
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 1}
            httpx.post(f"{engine_url}/v1/completions", json=body, headers=headers, timeout=30).raise_for_status()
            if self.stored(timeout_s=1.0):
                return

    def stored(self, timeout_s: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.socket.poll(100):
                if events:
                    return events
                continue
            _topic, _seq, payload = self.socket.recv_multipart()
            _ts, batch, *_ = msgpack.unpackb(payload, raw=False)
            events += [e for e in batch if e.get("type") == "BlockStored"]
        return events

    def close(self) -> None:
        self.socket.close(0)


def test_kv_routing_indexes_the_real_events_and_a_long_prefix_lands_on_its_holder(fleet: Fleet) -> None:
    subscribers = [KvEvents(r.kv_events) for r in fleet.replicas]
    for n, (replica, subscriber) in enumerate(zip(fleet.replicas, subscribers, strict=True)):
        subscriber.until_live(replica.engine_url, f"warm {n}")
    # A prompt of 4+ full blocks that no earlier test sent: the first request computes it, the others find it.
    prompt = " ".join(f"segment {i} of the shared system prompt for kv routing." for i in range(70))
    tokenized = httpx.post(f"{fleet.replicas[0].engine_url}/tokenize", json={"model": SERVED, "prompt": prompt})
    tokens: list[int] = tokenized.json()["tokens"]  # as the engine itself counts them
    assert len(tokens) >= 4 * BLOCK
    before = [counter_value(fleet.engine_metrics(n), "vllm:prefix_cache_hits_total") for n in range(2)]
    hits_before = counter_value(fleet.gateway_metrics(), "llmfleet_gateway_kv_hit_blocks_total", {"pool": POOL})
    client = fleet.openai()
    first = client.completions.with_raw_response.create(model=SERVED, prompt=prompt, max_tokens=4)
    holder = [fleet.replica_id(n) for n in range(2)].index(first.headers["x-llmfleet-replica"])
    events = subscribers[holder].stored(timeout_s=15)
    for s in subscribers:
        s.close()
    stored = [h for e in events for h in e["block_hashes"]]
    assert {e["block_size"] for e in events} == {BLOCK}
    full = len(tokens) // BLOCK
    # vLLM's own block hashes of these token ids under the tenant's salt (the gateway salts every request), as
    # the simulator computes them (engine_sim.block_hash): the salt is block 0's extra key, as the events say.
    salt = CacheSalts.from_engine_key(ENGINE_KEY).for_tenant("demo")
    assert events[0]["extra_keys"][0] == [salt] and events[0]["parent_block_hash"] is None
    expected = [external_hash(d) for d in chain_hashes(none_hash(HASH_SEED), tokens, BLOCK, [], cache_salt=salt)]
    assert stored[:full] == expected[:full]
    unsalted = [external_hash(d) for d in chain_hashes(none_hash(HASH_SEED), tokens, BLOCK, [])]
    assert stored[0] != unsalted[0]

    def indexed() -> float | None:
        blocks = gauge_value(fleet.gateway_metrics(), "llmfleet_gateway_kv_index_blocks", {"pool": POOL})
        return blocks if blocks >= full else None

    def kv_series() -> str:
        text = httpx.get(f"{fleet.admin()}/metrics", timeout=5).text
        return "\n".join(line for line in text.splitlines() if "_kv_" in line and not line.startswith("#"))

    wait_for(indexed, timeout_s=15, what="the gateway's KV index holding the prompt's blocks", diagnostics=kv_series)
    landed = [client.completions.with_raw_response.create(model=SERVED, prompt=prompt, max_tokens=4)
              .headers["x-llmfleet-replica"] for _ in range(3)]  # fmt: skip
    assert landed == [fleet.replica_id(holder)] * 3
    hits = counter_value(fleet.gateway_metrics(), "llmfleet_gateway_kv_hit_blocks_total", {"pool": POOL})
    assert hits - hits_before >= 3 * full
    after = [counter_value(fleet.engine_metrics(n), "vllm:prefix_cache_hits_total") for n in range(2)]
    assert after[holder] - before[holder] >= 3 * full * BLOCK  # vLLM counted the hits the gateway expected


def _busiest_engine(replicas: list[Replica]) -> Replica:
    """The replica whose engine reports the most running requests (waiting up to 30 s for any to)."""

    def running(replica: Replica) -> float:
        text = httpx.get(f"{replica.engine_url}/metrics", timeout=10).text
        lines = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    def busiest() -> Replica | None:
        counts = [(running(r), n) for n, r in enumerate(replicas)]
        top, n = max(counts)
        return replicas[n] if top >= 1 else None

    return wait_for(busiest, timeout_s=30, interval_s=0.2, what="an engine running the greedy streams")


async def test_an_engine_sigkilled_under_16_greedy_streams_loses_none_and_changes_no_text(fleet: Fleet) -> None:
    greedy = Greedy(fleet.gateways[0].url, count=16, max_tokens=1800)
    reference = await greedy.run()
    assert greedy.failures == [] and len(reference) == 16, greedy.failures
    # Half the streams under way (on a quiet machine all 16 can be nearly done by the time the last one starts):
    # the engine serving most of them dies with them.
    run = asyncio.create_task(greedy.run(on_started=lambda seen: seen >= 8))
    await asyncio.wait_for(greedy.started.wait(), timeout=120)
    # The engine running the most requests now, by its own count (a quiet machine's CI rehearsal killed the replica
    # its streams' headers named while its engine ran none of them, and nothing was resumed).
    victim = await asyncio.to_thread(_busiest_engine, fleet.replicas)
    await asyncio.to_thread(victim.kill_engine)
    try:
        texts = await run
        assert greedy.failures == [], greedy.failures
        differ = [p for p in reference if texts.get(p) != reference[p]]
        assert differ == [], f"{len(differ)} of 16 texts differ from their uninterrupted answer"
        samples = fleet.gateway_metrics()
        assert "llmfleet_gateway_resumed_streams_total" in samples, "no stream was under way on the killed engine"
        resumed = counter_value(samples, "llmfleet_gateway_resumed_streams_total", {"outcome": "completed"})
        assert resumed >= 1  # streams the engine held were resumed elsewhere
    finally:
        await asyncio.to_thread(wait_ready_replica, victim)  # the agent restarts its engine for the next test


async def test_a_drain_shorter_than_the_streams_under_steady_load_cuts_no_stream_and_fails_no_request(
    fleet: Fleet,
) -> None:
    for replica in fleet.replicas:  # both serving, whatever the test before left
        await asyncio.to_thread(wait_ready_replica, replica)
    for n in range(2):
        wait_for(lambda n=n: fleet.routable(n) == 2, timeout_s=30, what=f"gateway {n} routing to both replicas")
    greedy = Greedy(fleet.gateways[0].url, count=16, max_tokens=1800)
    reference = await greedy.run()
    assert greedy.failures == [], greedy.failures
    async with SteadyLoad(fleet.gateways[0].url, clients=4) as load:
        await async_wait_for(load.served, timeout_s=60, what="steady load served")
        run = asyncio.create_task(greedy.run(on_started=lambda seen: seen >= 16))
        await asyncio.wait_for(greedy.started.wait(), timeout=120)
        busiest = Counter(greedy.replicas.values()).most_common(1)[0][0]
        drained = fleet.replicas[[fleet.replica_id(n) for n in range(2)].index(busiest)]
        # SIGTERM: it drains in 10 s; its engine aborts what is left after 5 s and answers new requests 500.
        await asyncio.to_thread(drained.stop, 30)
        texts = await run
        await async_wait_for(load.served, timeout_s=60, what="steady load served after the drain")
    assert greedy.failures == [] and load.failures == [], (greedy.failures, load.failures)
    assert [p for p in reference if texts.get(p) != reference[p]] == []
