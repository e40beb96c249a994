"""The CPU build on the simulator (``--gpu-profile cpu-tiny``, `engine_sim.platform`): block size, refused flags,
``/version``, dev-mode sleep that frees nothing, 128-token KV blocks and events, and the measured step costs."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from engine_sim.block_hash import chain_hashes, external_hash, none_hash
from engine_sim.cli import ServeOptions, add_serve_arguments, build, main
from engine_sim.config import num_gpu_blocks
from engine_sim.engine import Engine
from engine_sim.errors import ConfigError
from engine_sim.faults import FaultPolicy
from engine_sim.kv_events import KVEventsConfig, KVEventSettings
from engine_sim.platform import CPU, CUDA, CpuStepCosts, platform_of
from engine_sim.server import create_app
from engine_sim.sleep import SleepController, WakeTiming
from engine_sim.timing import StepWork
from fleet.capacity.catalog import GIB, ModelFacts
from tests.engine_sim.builders import make_config, make_request, make_scheduler, run_until_idle

TINY = ModelFacts(parameters=840448, layers=2, hidden_size=128, kv_heads=2, head_dim=32, vocab_size=4253,
                  tied_embeddings=True, max_position=4096)  # fmt: skip
TINY_FLAGS = ("--model-facts", json.dumps(TINY.__dict__), "--max-model-len", "2048")


def _args(*flags: str, profile: str = "cpu-tiny") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(["qwen2.5-7b-instruct", "--gpu-profile", profile, *TINY_FLAGS, *flags])


def test_only_the_cpu_profile_plays_the_cpu_build() -> None:
    assert platform_of("cpu-tiny") is CPU
    assert {platform_of(g) for g in ("a100-80gb", "h100-80gb", "cpu-demo")} == {CUDA}


@pytest.mark.parametrize(
    ("profile", "flags", "blocks_of"),
    [
        pytest.param("cpu-tiny", (), 128, id="cpu default 128"),
        pytest.param("cpu-tiny", ("--block-size", "32"), 32, id="cpu 32"),
        pytest.param("cpu-tiny", ("--block-size", "64"), 64, id="cpu 64"),
        pytest.param("a100-80gb", (), 16, id="gpu default 16"),
        pytest.param("a100-80gb", ("--block-size", "32"), 32, id="gpu 32"),
        pytest.param("a100-80gb", ("--block-size", "128"), 128, id="gpu 128"),
    ],
)
def test_the_block_size_is_the_platforms_default_or_an_accepted_flag(
    profile: str, flags: tuple[str, ...], blocks_of: int
) -> None:
    assert build(_args(*flags, profile=profile)).config.block_tokens == blocks_of


@pytest.mark.parametrize(
    ("profile", "size", "message"),
    [
        pytest.param("cpu-tiny", "16", r"No common block size for 16 \(CPU_ATTN: \[MultipleOf\(32\)\]\)", id="cpu 16"),
        pytest.param("cpu-tiny", "48", r"No common block size for 48 \(CPU_ATTN", id="cpu 48"),
        pytest.param("a100-80gb", "24", r"No common block size for 24 \(FLASH_ATTN: \[MultipleOf\(16\)\]\)", id="gpu"),
    ],
)
def test_a_block_size_the_build_refuses_fails_at_start_in_vllms_words(profile: str, size: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(_args("--block-size", size, profile=profile))


def test_sleep_mode_is_refused_at_start_on_the_cpu_build_even_in_dev_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    with pytest.raises(ConfigError, match="Sleep mode is not supported on current platform"):
        build(_args("--enable-sleep-mode"))
    assert build(_args("--enable-sleep-mode", profile="a100-80gb")).sleep_routes is True


@pytest.mark.parametrize(("dev_mode", "served"), [("1", True), ("0", False)])
def test_dev_mode_alone_serves_the_sleep_routes_on_the_cpu_build(
    monkeypatch: pytest.MonkeyPatch, dev_mode: str, served: bool
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", dev_mode)
    assert build(_args()).sleep_routes is served
    assert build(_args(profile="a100-80gb")).sleep_routes is False  # a GPU needs the flag too


def test_the_cpu_kv_cache_is_vllm_cpu_kvcache_space_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert num_gpu_blocks(build(_args()).config) == 16384  # the real engine's cache_config_info for 1 GiB
    assert build(_args("--kv-cache-memory-bytes", str(GIB // 2))).config.kv_cache_memory_bytes == GIB // 2
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1.5")
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE"):
        build(_args())


def test_the_cpu_builds_kv_blocks_and_events_are_128_tokens_with_vllms_hashes() -> None:
    events = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))
    sched = make_scheduler(gpu_profile="cpu-tiny", facts=TINY, max_model_len=2048, kv_events=events)
    assert sched.kv.block_size == 128
    prompt = list(range(300))
    sched.add(make_request(prompt, max_tokens=4), now=0.0)
    run_until_idle(sched)
    assert sched.kv.pool.events is not None
    stored = [e for e in sched.kv.pool.events.take() if e["type"] == "BlockStored"]
    assert {e["block_size"] for e in stored} == {128}
    hashes = [h for e in stored for h in e["block_hashes"]]
    assert hashes == [external_hash(d) for d in chain_hashes(none_hash(), prompt, 128, [])]  # 2 full blocks


@contextlib.asynccontextmanager
async def _serving(opts: ServeOptions) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    engine = Engine(opts.config, time_scale=20.0)
    engine.start()
    sleep = SleepController(engine, WakeTiming.for_config(opts.config), frees_memory=opts.config.platform.sleep_mode)
    app = create_app(engine, opts.settings, FaultPolicy(opts.faults), sleep=sleep if opts.sleep_routes else None)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    client = httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30.0)
    try:
        yield client, engine
    finally:
        await client.aclose()
        await runner.cleanup()
        await engine.stop()


async def test_the_cpu_build_says_0_32_0_and_128_token_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    async with _serving(build(_args())) as (client, _):
        assert (await client.get("/version")).json() == {"version": "0.32.0"}
        metrics = (await client.get("/metrics")).text
    info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'block_size="128"' in info and 'num_gpu_blocks="16384"' in info
    async with _serving(build(_args(profile="a100-80gb"))) as (client, _):
        assert (await client.get("/version")).json() == {"version": "0.33.0"}


async def test_a_dev_mode_sleep_on_the_cpu_build_pauses_and_keeps_the_weights(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    body = {"model": "qwen2.5-7b-instruct", "prompt": list(range(300)), "max_tokens": 4, "temperature": 0}
    async with _serving(build(_args())) as (client, engine):
        before = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        assert (await client.post("/sleep", params={"level": "2"})).json() == {"status": "sleeping", "level": 2}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert "sleep mode is not supported on CPU, ignore it" in caplog.text
        assert (await client.post("/wake_up")).json() == {"status": "awake", "tags": None}
        hits = engine.scheduler.stats.prefix_hits
        again = (await client.post("/v1/completions", json=body)).json()
        assert engine.scheduler.stats.prefix_hits == hits  # the engine core reset the prefix cache, as vLLM's does
    assert again["choices"][0]["text"] == before  # a level-2 sleep kept the weights: nothing was discarded


@pytest.mark.parametrize(
    ("name", "work", "seqs", "expected_ms"),
    [
        pytest.param("one decode", StepWork(1, 40, 0.0), 1, 1.9662, id="decode-1"),
        pytest.param("32 decodes", StepWork(32, 32 * 40, 0.0), 32, 7.1540, id="decode-32"),
        pytest.param("a 1500-token prompt", StepWork(1500, 0, 1500.0 * 1500), 1, 26.386, id="prefill-1500"),
    ],
)
def test_the_cpu_step_costs_are_the_fitted_formula(name: str, work: StepWork, seqs: int, expected_ms: float) -> None:
    sched = make_scheduler(gpu_profile="cpu-tiny", facts=TINY, max_model_len=2048)
    assert sched.timer.base_seconds(work, seqs) * 1000 == pytest.approx(expected_ms, rel=1e-3), name


def test_cpu_step_costs_pace_is_flat_for_a_few_sequences_then_grows_per_sequence() -> None:
    costs = CpuStepCosts(fixed_s=2e-3, per_sequence_s=0.2e-3, per_token_s=0.0)
    assert costs.step_seconds(0, 0) == 0.0
    assert costs.step_seconds(1, 1) == pytest.approx(costs.step_seconds(2, 2), rel=0.02)
    assert costs.step_seconds(64, 64) == pytest.approx(64 * 0.2e-3, rel=0.03)


def test_the_gpu_profiles_keep_the_roofline() -> None:
    config = make_config()
    sched = make_scheduler()
    assert sched.timer.cpu is None
    work = StepWork(8, 8 * 100, 0.0)
    assert sched.timer.base_seconds(work, 8) == config.step_model.step_seconds(8, 8 * 100, 0.0)


def test_llmfleet_sim_serve_exits_1_naming_the_refusal_as_vllm_does(caplog: pytest.LogCaptureFixture) -> None:
    argv = ["serve", "qwen2.5-7b-instruct", "--gpu-profile", "cpu-tiny", *TINY_FLAGS, "--block-size", "16"]
    assert main(argv) == 1
    assert "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])." in caplog.text
