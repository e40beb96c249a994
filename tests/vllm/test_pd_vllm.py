"""Prefill and decode apart on two real vLLM engines over NIXL: a decode replica and a prefill replica (each
started by its agent, the roles' ``--kv-transfer-config`` and side channels the agent's), a gateway in front.

The gateway knows the decode engine as the pool's static replica and the prefill engine, through a `FaultRelay`, as
the ``qwen-7b-prefill`` role pool's; it reads both engines' KV events. A prompt whose uncached tokens exceed the
pool's threshold (256 here) takes the two legs, and its greedy text must equal what the prefill engine answers
for the same body alone (the engine that computed the KV cache itself, so a transfer that moved the wrong bytes
would show); a short one stays on the decode replica. The last test SIGKILLs the prefill engine after it answered
its leg and before the decode leg starts (the relay runs the kill between the engine's answer and its delivery):
the decode engine cannot load the KV cache (``kvLoadFailurePolicy: fail``: its first event is the error), and the
gateway prefills on the decode replica instead, before the client sees a byte. The tests run in file order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from fleet.protocol.control_auth import ENGINE_API_KEY_ENV
from fleet.protocol.keys import DEMO_API_KEY
from fleet.protocol.promtext import counter_value, gauge_value, parse
from tests.gateway.conftest import ADMIN_MARKER
from tests.support.fault_relay import FaultRelay
from tests.support.procs import Proc, Procs
from tests.support.wait import wait_for
from tests.vllm.conftest import SERVED, vllm_stack
from tests.vllm.engines import Replica, start_replica

POOL, PREFILL = "qwen-7b", "qwen-7b-prefill"
ENGINE_KEY = "sk-engines-vllm-pd"
CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM's CPU build: the cores its OpenMP threads are bound to
THRESHOLD = 256
MAX_TOKENS = 12
PATHS = ("disaggregated", "aggregated", "prefill_failed", "decode_failed", "no_prefill_replica")
WORDS = "fleet engine prefill decode gateway replica cache block token stream agent pool".split()


class PdFleet:
    def __init__(self, decode: Replica, prefill: Replica, relay: FaultRelay, gateway: Proc) -> None:
        self.decode, self.prefill, self.relay, self.gateway = decode, prefill, relay, gateway
        self.client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=DEMO_API_KEY, max_retries=0, timeout=180)

    def paths(self) -> dict[str, float]:
        """The gateway's ``pd_requests_total`` by path."""
        text = httpx.get(f"{self.gateway.logged_url(ADMIN_MARKER)}/metrics", timeout=5).text
        samples = parse(text)
        if "llmfleet_gateway_pd_requests_total" not in samples:  # before the first request
            return dict.fromkeys(PATHS, 0.0)
        return {
            path: counter_value(samples, "llmfleet_gateway_pd_requests_total", {"model": SERVED, "path": path})
            for path in PATHS
        }

    def engine_counter(self, replica: Replica, name: str) -> float:
        """Counter ``name`` (a histogram's ``_count`` too) of ``replica``'s engine, over all its series."""
        samples = parse(httpx.get(f"{replica.engine_url}/metrics", timeout=10).text)
        return gauge_value(samples, name, {}) if name.endswith("_count") else counter_value(samples, name, {})

    def alone(self, replica: Replica, messages: list[ChatCompletionUserMessageParam]) -> str:
        """The greedy answer of ``replica``'s engine to ``messages`` by itself, aggregated (no gateway)."""
        body = {"model": SERVED, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
        headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
        answer = httpx.post(f"{replica.engine_url}/v1/chat/completions", json=body, headers=headers, timeout=180)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["choices"][0]["message"]["content"])

    def streamed(self, messages: list[ChatCompletionUserMessageParam]) -> str:
        chunks = self.client.chat.completions.create(
            model=SERVED,
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _prompt(seed: int, words: int = 700) -> list[ChatCompletionUserMessageParam]:
    """A fresh user message of about ``words`` tokens (the tiny tokenizer: a word is about one token)."""
    draw = random.Random(seed)
    return [{"role": "user", "content": " ".join(draw.choice(WORDS) for _ in range(words))}]


@pytest.fixture(scope="module")
def fleet(module_procs: Procs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdFleet]:
    folder = tmp_path_factory.mktemp("stacks")
    pd = {"prefill": {"replicas": {"min": 1, "max": 1}}, "thresholdTokens": THRESHOLD, "kvLoadFailurePolicy": "fail"}
    # A first token within 120 s, not 30: on a loaded two-core CI machine one KV transfer over UCX/TCP took 27 s
    # (and a handshake 5 s), and a decode leg the gateway gives up on mid-transfer left the engine hung.
    # A start that hangs is restarted after 200 s, not the stack's 300 (once here an engine's API server stopped
    # after reading its config, and the restart came up in a minute).
    overrides = {"pools.0.disaggregation": pd, "gateway.timeouts.firstTokenS": 120, "pools.0.coldStartSeconds": 200}
    stack = vllm_stack(folder / "Pulumi.vllm-pd.yaml", **overrides)
    env = {ENGINE_API_KEY_ENV: ENGINE_KEY}
    # One at a time: two engines starting together on two cores take minutes. Each on a core of its own, as two
    # engines on two hosts would be: vLLM's CPU build binds its OpenMP threads to every core by default, and two
    # such engines on two cores starve the prefill engine's side-channel thread past NIXL's hard-coded 5 s
    # handshake (measured here: the decode leg's error event after 5.03 s; with one core each, its first token
    # after 0.2 s).
    decode = start_replica(module_procs, stack, "d0", env={**env, CPU_BIND: "1"})
    prefill = start_replica(module_procs, stack, "p0", env={**env, CPU_BIND: "0"}, pool=PREFILL)
    relay = FaultRelay(prefill.engine_url).start()
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--seed", "1", "--no-access-log",
            "--replica", decode.engine_url, "--kv-events", decode.kv_events,
            "--replica", f"{PREFILL}={relay.url}", "--kv-events", f"{PREFILL}={prefill.kv_events}"]  # fmt: skip
    gateway = module_procs.start(argv, name="gateway", stop_timeout_s=10, env=env)
    gateway.wait_url("listening on")
    admin = gateway.logged_url(ADMIN_MARKER)

    def both_routable() -> bool:
        ready = httpx.get(f"{admin}/readyz", timeout=2).json().get("routable_replicas", {})
        return bool(ready.get(POOL)) and bool(ready.get(PREFILL))

    wait_for(both_routable, timeout_s=30, what="the gateway routing to both roles")
    fleet = PdFleet(decode, prefill, relay, gateway)
    yield fleet
    fleet.client.close()
    relay.close()


def test_both_engines_run_their_role_with_nixl(fleet: PdFleet) -> None:
    for replica, role in ((fleet.decode, "kv_consumer"), (fleet.prefill, "kv_producer")):
        status = replica.status()
        argv = status["engine"]["argv"]
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector" and config["kv_role"] == role, config


def test_a_long_prompt_takes_two_legs_and_answers_the_aggregated_text(fleet: PdFleet) -> None:
    messages = _prompt(1)
    reference = fleet.alone(fleet.prefill, messages)
    before = fleet.paths()
    prefilled = fleet.engine_counter(fleet.prefill, "vllm:prompt_tokens_total")
    assert fleet.streamed(messages) == reference
    after = fleet.paths()
    assert after["disaggregated"] == before["disaggregated"] + 1, after
    # The prefill engine computed the prompt (its own cache held it: its prompt counter counts it again anyway).
    assert fleet.engine_counter(fleet.prefill, "vllm:prompt_tokens_total") >= prefilled + THRESHOLD
    # NIXL's transfer histogram: the decode engine read the blocks (the simulator exports it too).
    assert fleet.engine_counter(fleet.decode, "vllm:nixl_xfer_time_seconds_count") >= 1

    # A whole answer takes the two legs too.
    whole_messages = _prompt(2)
    whole_reference = fleet.alone(fleet.prefill, whole_messages)
    answer = fleet.client.chat.completions.create(
        model=SERVED,
        messages=whole_messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert answer.choices[0].message.content == whole_reference
    assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS
    assert fleet.paths()["disaggregated"] == before["disaggregated"] + 2


def test_a_short_prompt_stays_on_the_decode_replica(fleet: PdFleet) -> None:
    before = fleet.paths()
    prefilled = fleet.engine_counter(fleet.prefill, "vllm:prompt_tokens_total")
    assert fleet.streamed(_prompt(3, words=40))
    after = fleet.paths()
    assert after["aggregated"] == before["aggregated"] + 1 and after["disaggregated"] == before["disaggregated"]
    assert fleet.engine_counter(fleet.prefill, "vllm:prompt_tokens_total") == prefilled


def test_a_prefill_engine_killed_between_the_legs_leaves_the_client_a_whole_answer(fleet: PdFleet) -> None:
    messages = _prompt(4)
    reference = fleet.alone(fleet.prefill, messages)
    before = fleet.paths()

    def answered_its_leg(body: bytes) -> bool:
        try:
            params: Any = json.loads(body).get("kv_transfer_params")
        except (ValueError, AttributeError):
            return False
        return isinstance(params, dict) and params.get("do_remote_prefill") is True

    fleet.relay.arm(answered_its_leg, fleet.prefill.kill_engine)
    assert fleet.streamed(messages) == reference  # no error event, no cut: the whole greedy answer
    assert fleet.relay.fired.is_set(), "the prefill leg never reached the relay"
    after = fleet.paths()
    assert after["decode_failed"] == before["decode_failed"] + 1, after
