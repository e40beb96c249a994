"""NIXL P/D in process: the config's refusals, the scheduler's held and pulled blocks, chat legs and the lease."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from engine_sim.engine import Engine
from engine_sim.errors import ConfigError
from engine_sim.kv_transfer import KVTransferSettings, settings_from
from engine_sim.nixl import NixlConnector, kv_link
from engine_sim.request import FinishReason
from engine_sim.server import ServerSettings, create_app
from tests.engine_sim.builders import make_config, make_request, make_scheduler, run_until_idle
from tests.support.wait import async_wait_for

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}


@pytest.mark.parametrize(
    ("raw", "device", "sleep_mode", "refusal"),
    [
        ({"kv_connector": "Nope", "kv_role": "kv_producer"}, "cuda", False, "Unsupported connector type: Nope"),
        ({"kv_connector": "ExampleConnector", "kv_role": "kv_producer"}, "cuda", False, "plays only"),
        ({**NIXL, "kv_role": "producer"}, "cuda", False, "Unsupported kv_role: producer"),
        ({"kv_connector": "NixlConnector"}, "cuda", False, "Please specify kv_role"),
        ({**NIXL, "kv_load_failure_policy": "retry"}, "cuda", False, "kv_load_failure_policy"),
        ({**NIXL, "kv_buffer_size": 1e9}, "cuda", False, "unknown field(s) ['kv_buffer_size']"),
        ({**NIXL, "kv_buffer_device": "cuda"}, "cpu", False, "cpu with cuda kv_buffer is not supported"),
        ({**NIXL, "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}}, "cuda", True, "sleep mode"),
    ],
)
def test_what_vllm_refuses_at_start_is_refused(
    raw: dict[str, Any], device: str, sleep_mode: bool, refusal: str
) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        settings_from(raw, {}, device, sleep_mode)
    assert refusal in str(caught.value)


def test_defaults_and_the_side_channel_environment_are_vllms() -> None:
    default = settings_from(NIXL, {}, "cuda", sleep_mode=False)
    assert default is not None
    assert (default.side_channel_host, default.side_channel_port) == ("localhost", 5600)
    assert (default.buffer_device, default.backends, default.lease_s, default.failure_policy) == (
        "cuda", ("UCX",), 30.0, "fail",
    )  # fmt: skip
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "15600"}
    other = settings_from(NIXL, env, "cpu", sleep_mode=False)
    assert other is not None and (other.side_channel_host, other.side_channel_port) == ("10.0.0.7", 15600)
    assert other.buffer_device == "cpu" and other.engine_id != default.engine_id  # a random uuid4 each start
    assert settings_from(None, {}, "cuda", False) is None
    with pytest.raises(ConfigError, match="VLLM_NIXL_SIDE_CHANNEL_PORT"):
        settings_from(NIXL, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "cuda", False)


def test_a_length_capped_prefill_leg_keeps_its_blocks_until_released() -> None:
    sched = make_scheduler(num_gpu_blocks_override=64, max_model_len=1024)
    held, plain = make_request(40, max_tokens=1, kv_hold=True), make_request(40, max_tokens=1)
    for request in (held, plain):
        sched.add(request, 0.0)
    run_until_idle(sched)
    assert held.finish_reason is FinishReason.LENGTH
    assert list(sched.held) == [held.request_id] and len(sched.held[held.request_id]) == 3  # 40 tokens, 16 a block
    assert sched.kv.pool.num_free == 61
    assert sched.release_held(held.request_id) and not sched.release_held(held.request_id)
    assert sched.kv.pool.num_free == 64


def test_a_decode_leg_computes_only_its_last_prompt_token() -> None:
    sched = make_scheduler()
    pulled, local = make_request(300, max_tokens=2, remote_tokens=300), make_request(300, max_tokens=2)
    sched.add(pulled, 0.0)
    first = sched.step(0.0)
    assert first is not None and first.plan.scheduled == ((pulled, 1),)
    assert (pulled.num_cached_tokens, pulled.num_external_computed_tokens) == (299, 299)
    sched.add(local, 0.0)
    run_until_idle(sched, first.plan.end)
    assert local.num_cached_tokens == 0 and local.num_external_computed_tokens == 0


@contextlib.asynccontextmanager
async def _engine(**kv: Any) -> AsyncIterator[tuple[httpx.AsyncClient, NixlConnector]]:
    """An in-process simulator with a NixlConnector whose side channel binds a free loopback port."""
    config = make_config(max_model_len=4096)
    settings = settings_from({**NIXL, **kv}, {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                              "VLLM_NIXL_SIDE_CHANNEL_PORT": "0"}, "cuda", False)  # fmt: skip
    assert isinstance(settings, KVTransferSettings)
    engine = Engine(config, time_scale=20.0)
    engine.start()
    nixl = NixlConnector(settings, engine, kv_link(config.gpu_profile, 1, cpu_build=False))
    await nixl.start()
    names = (config.served_model_name,)
    app = create_app(engine, ServerSettings(config.model, names, config.max_model_len), nixl=nixl)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    client = httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30.0)
    try:
        yield client, nixl
    finally:
        await client.aclose()
        await runner.cleanup()
        await nixl.close()
        await engine.stop()


CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "Tell me about caches. " * 40}], "max_tokens": 8}
LEG1 = {**CHAT, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}


async def test_chat_legs_answer_the_aggregated_chat() -> None:
    async with _engine() as (prefill, _), _engine(kv_role="kv_consumer") as (decode, _):
        reference = (await decode.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
        leg1 = (await prefill.post("/v1/chat/completions", json=LEG1, headers={"X-Request-Id": "r1"})).json()
        params = leg1["kv_transfer_params"]
        assert params["remote_request_id"].startswith("chatcmpl-r1-") and params["remote_block_ids"][0]
        answer = (await decode.post("/v1/chat/completions", json={**CHAT, "kv_transfer_params": params})).json()
        assert answer["choices"][0]["message"] == reference
        assert answer["kv_transfer_params"] is None  # a decode leg returns none


async def test_blocks_nobody_pulls_are_freed_when_the_lease_ends_and_a_later_pull_fails() -> None:
    async with _engine(kv_connector_extra_config={"kv_lease_duration": 0.3}) as (prefill, p_nixl):
        async with _engine(kv_role="kv_consumer") as (decode, _):
            leg1 = (await prefill.post("/v1/chat/completions", json=LEG1)).json()
            pool = p_nixl.engine.scheduler.kv.pool
            assert pool.num_free < pool.num_blocks
            await async_wait_for(
                lambda: pool.num_free == pool.num_blocks, timeout_s=5, what="the lease to free the blocks"
            )
            body = {**CHAT, "kv_transfer_params": leg1["kv_transfer_params"]}
            late = await decode.post("/v1/chat/completions", json=body)
            assert late.status_code == 500 and late.json()["error"]["message"] == "Internal server error"
