"""Sleep mode on the simulator, in-process: the endpoints, the gauge, queueing while asleep, the wake-time
calibration and the fault that changes a wake's tokens."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from engine_sim.cli import add_serve_arguments, build
from engine_sim.engine import Engine
from engine_sim.errors import ConfigError
from engine_sim.faults import FaultPolicy, FaultSpec
from engine_sim.server import ServerSettings, create_app
from engine_sim.sleep import HOST_TO_DEVICE_BYTES_S, SleepController, WakeTiming
from tests.engine_sim.builders import make_config
from tests.support.wait import async_wait_for

CHECK = {"model": "qwen", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}


@contextlib.asynccontextmanager
async def sleepy_sim(
    time_scale: float = 20.0, wake_changes_tokens: bool = False, sleep: bool = True
) -> AsyncIterator[tuple[httpx.AsyncClient, SleepController | None]]:
    config = make_config(max_model_len=4096)
    engine = Engine(config, time_scale=time_scale)
    engine.start()
    controller = SleepController(engine, WakeTiming.for_config(config), wake_changes_tokens) if sleep else None
    settings = ServerSettings(model=config.model, served_model_names=("qwen",), max_model_len=4096)
    app = create_app(engine, settings, FaultPolicy(FaultSpec()), sleep=controller)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    client = httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30.0)
    try:
        yield client, controller
    finally:
        await client.aclose()
        await runner.cleanup()
        await engine.stop()


def sleep_states(metrics: str) -> dict[str, float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith("vllm:engine_sleep_state{"):
            labels, value = line.rsplit(" ", 1)
            state = labels.split('sleep_state="', 1)[1].split('"', 1)[0]
            assert 'engine="0"' in labels and 'model_name="qwen"' in labels
            out[state] = float(value)
    return out


async def text_of(client: httpx.AsyncClient, body: dict[str, Any] = CHECK) -> str:
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


async def test_without_sleep_mode_the_endpoints_do_not_exist() -> None:
    async with sleepy_sim(sleep=False) as (client, _):
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            assert (await client.request(method, path)).status_code == 404
        assert "vllm:engine_sleep_state" not in (await client.get("/metrics")).text


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (0, {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 0.0}),
        (1, {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}),
        (2, {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}),
    ],
)
async def test_sleep_sets_the_gauge_and_health_stays_200(level: int, expected: dict[str, float]) -> None:
    async with sleepy_sim() as (client, _):
        assert sleep_states((await client.get("/metrics")).text) == {
            "awake": 1.0,
            "weights_offloaded": 0.0,
            "discard_all": 0.0,
        }
        response = await client.post("/sleep", params={"level": level})
        assert response.json() == {"status": "sleeping", "level": level}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert (await client.get("/health")).status_code == 200
        assert sleep_states((await client.get("/metrics")).text) == expected
        assert (await client.post("/wake_up")).json() == {"status": "awake", "tags": None}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert sleep_states((await client.get("/metrics")).text)["awake"] == 1.0
        assert "vllm:sleep_mode_operation_duration_seconds_count" in (await client.get("/metrics")).text


async def test_a_partial_wake_stays_asleep_until_every_tag_is_awake() -> None:
    async with sleepy_sim() as (client, _):
        await client.post("/sleep")
        partial = (await client.post("/wake_up", params={"tags": "weights"})).json()
        assert partial == {"status": "sleeping", "tags": ["kv_cache", "scheduling"]}
        assert sleep_states((await client.get("/metrics")).text)["awake"] == 0.0
        assert (await client.post("/wake_up", params={"tags": "kv_cache"})).json()["status"] == "awake"


async def test_a_request_that_arrives_asleep_is_queued_until_the_wake() -> None:
    async with sleepy_sim() as (client, _):
        before = await text_of(client)
        await client.post("/sleep")
        pending = asyncio.ensure_future(text_of(client))
        done, _ = await asyncio.wait({pending}, timeout=0.5)  # many times the request's own duration
        assert not done, "answered while asleep"
        await client.post("/wake_up")
        assert await asyncio.wait_for(pending, timeout=10) == before


async def test_sleep_aborts_in_flight_requests_by_default() -> None:
    async with sleepy_sim(time_scale=1.0) as (client, _):
        long = asyncio.ensure_future(client.post("/v1/completions", json={**CHECK, "max_tokens": 2000}))

        async def running() -> bool:
            m = (await client.get("/metrics")).text
            return (
                "vllm:num_requests_running{" in m and 'num_requests_running{engine="0",model_name="qwen"} 0.0' not in m
            )

        await async_wait_for(running, timeout_s=10, interval_s=0.02, what="the request started")
        await client.post("/sleep")
        assert (await long).json()["choices"][0]["finish_reason"] == "abort"


@pytest.mark.parametrize("changes", [False, True], ids=["same-tokens", "fault-other-tokens"])
async def test_a_level_1_wake_answers_as_before_unless_the_fault_is_on(changes: bool) -> None:
    async with sleepy_sim(wake_changes_tokens=changes) as (client, _):
        before = await text_of(client)
        await client.post("/sleep", params={"level": 1})
        await client.post("/wake_up")
        assert (await text_of(client) != before) is changes


async def test_a_level_2_wake_is_garbage_until_reload_weights() -> None:
    async with sleepy_sim() as (client, _):
        before = await text_of(client)
        await client.post("/sleep", params={"level": 2})
        await client.post("/wake_up")
        assert await text_of(client) != before
        response = await client.post("/collective_rpc", json={"method": "reload_weights"})
        assert response.json() == {"results": [None]}
        assert await text_of(client) == before


async def test_bad_arguments_are_400_in_vllms_error_shape() -> None:
    async with sleepy_sim() as (client, _):
        for params in ({"level": 3}, {"level": "one"}, {"mode": "later"}):
            response = await client.post("/sleep", params=params)
            assert response.status_code == 400 and "message" in response.json()["error"]
        assert (await client.post("/wake_up", params={"tags": "everything"})).status_code == 400


async def test_the_wake_takes_the_calibrated_time() -> None:
    async with sleepy_sim(time_scale=2.0) as (client, controller):
        assert controller is not None
        expected = controller.timing.move_s(copies_weights=True) / 2.0  # model seconds over the time scale
        await client.post("/sleep")
        start = time.monotonic()
        await client.post("/wake_up")
        took = time.monotonic() - start
        assert expected <= took < expected + 0.3


@pytest.mark.parametrize(
    ("what", "weight_bytes", "gpu", "published_s"),
    [
        # vLLM blog 2025-10-26, A100 TP=1, level 1 (0.25-0.28 s; 2.85-2.89 s)
        ("Qwen3-0.6B BF16 on A100", 0.75e9 * 2, "a100-80gb", 0.265),
        ("Qwen3-Coder-30B-A3B BF16 on A100", 30.5e9 * 2, "a100-80gb", 2.87),
        # vllm#48310: 0.590 s median wake-to-first-correct-token
        ("Qwen3-8B BF16 on H100", 8.19e9 * 2, "h100-80gb", 0.590),
    ],
)
def test_wake_time_is_within_10_percent_of_the_published_figures(
    what: str, weight_bytes: float, gpu: str, published_s: float
) -> None:
    modelled = WakeTiming(weight_bytes, HOST_TO_DEVICE_BYTES_S[gpu]).move_s(copies_weights=True)
    assert abs(modelled - published_s) <= 0.1 * published_s, (what, modelled)


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(["Qwen/Qwen2.5-7B-Instruct", *flags])


@pytest.mark.parametrize(
    ("flags", "dev_mode", "served"),
    [(("--enable-sleep-mode",), "1", True), (("--enable-sleep-mode",), "0", False), ((), "1", False)],
)
def test_the_endpoints_need_both_the_flag_and_dev_mode(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], dev_mode: str, served: bool
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", dev_mode)
    assert build(_args(*flags)).sleep_routes is served


def test_dev_mode_true_fails_at_startup_as_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "true")
    with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE"):
        build(_args("--enable-sleep-mode"))
