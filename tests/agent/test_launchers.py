"""Launchers: the exact vLLM command line for the prod pool, the simulator's, and the registry."""

from __future__ import annotations

import json
import sys

import pytest

from agent.launchers import REGISTRY, LaunchConfig, Launcher, make_launcher
from fleet.spec.loader import load_spec
from fleet.spec.plugins import ENGINE_KIND
from tests.support import stacks


def test_vllm_argv_for_the_prod_pool_is_exact() -> None:
    pool = load_spec("prod").spec.pool("qwen-7b")
    argv = make_launcher(pool, LaunchConfig(host="0.0.0.0", port=8000)).argv()
    assert argv[1:] == [
        "serve", "Qwen/Qwen2.5-7B-Instruct",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--served-model-name", "qwen2.5-7b-instruct",
        "--tensor-parallel-size", "1",
        "--gpu-memory-utilization", "0.9",
        "--max-model-len", "8192",
        "--max-num-seqs", "256",
        "--max-num-batched-tokens", "2048",
        "--enable-prefix-caching",
        "--shutdown-timeout", "330",  # grace 345 - propagation 10 - 5: covers gateway.timeouts.totalS 330
    ]  # fmt: skip
    assert argv[0].endswith("vllm")


@pytest.mark.parametrize("removed", ["--disable-log-requests", "--swap-space", "--swap-space=4"])
def test_flags_removed_from_vllm_are_rejected(removed: str) -> None:
    pool = stacks.pool(**{"engine.kind": "vllm", "engine.extraArgs": [removed]})
    with pytest.raises(ValueError, match="removed"):
        make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1)).argv()


def test_optional_flags_follow_the_spec() -> None:
    pool = stacks.pool(**{"engine.kind": "vllm", "engine.enablePrefixCaching": False, "engine.dtype": "bfloat16"})
    argv = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, extra_args=("--enforce-eager",))).argv()
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[-1] == "--enforce-eager"


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_kv_events_put_vllms_config_flag_with_a_bound_socket_and_the_replicas_topic(kind: str) -> None:
    pool = stacks.pool(**{"engine.kind": kind, "engine.kvEvents": True})
    config = LaunchConfig(host="0.0.0.0", port=1, kv_events_port=5557, replica="qwen-7b-0")
    argv = make_launcher(pool, config).argv()
    value = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert value == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",  # vLLM binds an endpoint with "*" and connects to any other
        "topic": f"kv@qwen-7b-0@{pool.served_name}",
    }
    assert "--kv-events-config" not in make_launcher(stacks.pool(**{"engine.kind": kind}), config).argv()


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_a_tokenizer_folder_reaches_the_engine_as_vllms_tokenizer_flag(kind: str) -> None:
    pool = stacks.pool(**{"engine.kind": kind, "engine.tokenizer": "models/llmfleet-tiny-tokenizer"})
    config = LaunchConfig(host="127.0.0.1", port=1)
    argv = make_launcher(pool, config).argv()
    assert argv[argv.index("--tokenizer") + 1] == "models/llmfleet-tiny-tokenizer"
    assert "--tokenizer" not in make_launcher(stacks.pool(**{"engine.kind": kind}), config).argv()


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_a_pooling_pool_runs_its_engine_with_vllms_pooling_runner(kind: str) -> None:
    # vLLM's --runner pooling: /v1/embeddings and no generation (docs.vllm.ai, models/pooling_models)
    config = LaunchConfig(host="127.0.0.1", port=1)
    argv = make_launcher(stacks.pool(**{"engine.kind": kind, "engine.runner": "pooling"}), config).argv()
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert "--runner" not in make_launcher(stacks.pool(**{"engine.kind": kind}), config).argv()  # vLLM's auto


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_a_responses_store_reaches_the_engine_as_vllms_environment_switch(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM reads VLLM_ENABLE_RESPONSES_API_STORE as bool(int(...)); without it store=true is dropped
    monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    config = LaunchConfig(host="127.0.0.1", port=1)
    stored = make_launcher(stacks.pool(**{"engine.kind": kind, "engine.responsesStore": True}), config)
    assert stored.environment()["VLLM_ENABLE_RESPONSES_API_STORE"] == "1"
    plain = make_launcher(stacks.pool(**{"engine.kind": kind}), config)
    assert "VLLM_ENABLE_RESPONSES_API_STORE" not in plain.environment()


def test_sim_argv_runs_the_simulator_with_vllm_flags_plus_sim_settings() -> None:
    pool = stacks.pool(**{"engine.sim": {"timeScale": 20, "startupSeconds": 0.5, "gpuProfile": "a100-80gb"}})
    config = LaunchConfig(host="127.0.0.1", port=4321, extra_args=("--fault-hang",))
    argv = make_launcher(pool, config).argv()
    assert argv[:6] == [sys.executable, "-m", "llmfleet.cli", "sim", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    flags = argv[6:]
    pairs = dict(zip(flags[::2], flags[1::2], strict=False))
    assert pairs["--port"] == "4321" and pairs["--max-num-seqs"] == "64"
    assert flags[flags.index("--time-scale") + 1] == "20"
    assert flags[flags.index("--startup-seconds") + 1] == "0.5"
    assert flags[flags.index("--shutdown-timeout") + 1] == "6"  # 12 - 0.5 - 5, floored
    assert flags[-1] == "--fault-hang"


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_adapters_become_vllms_lora_flags_with_their_fetched_directories(kind: str) -> None:
    adapters = [{"name": "sql", "source": "acme/sql-lora"}, {"name": "chat", "source": "acme/chat-lora", "rank": 8}]
    pool = stacks.pool(**{"engine.kind": kind, "engine.maxLoras": 2, "adapters": adapters})
    config = LaunchConfig(host="127.0.0.1", port=1, adapter_dirs={"sql": "/models/store/acme/sql-lora/main"})
    argv = make_launcher(pool, config).argv()
    at = argv.index("--enable-lora")
    assert argv[at : at + 8] == [
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
        "--lora-modules", "sql=/models/store/acme/sql-lora/main", "chat=acme/chat-lora",
    ]  # fmt: skip
    assert "--enable-lora" not in make_launcher(stacks.pool(), config).argv()


def test_registry_holds_the_engine_kinds_the_validator_checks() -> None:
    assert {"vllm", "sim"} <= set(REGISTRY)
    assert REGISTRY.kind == ENGINE_KIND


def test_unknown_kind_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="registered: .*sim.*vllm"):
        make_launcher(stacks.pool(**{"engine.kind": "tgi"}), LaunchConfig(host="127.0.0.1", port=1))


CPU_ONLY = {"--gpu-memory-utilization", "--enable-sleep-mode"}  # vLLM on CPU: a share of host memory; refused


def _vllm(device: str, **overrides: object) -> Launcher:
    pool = stacks.pool(**{"engine.kind": "vllm", "engine.sleepMode": True, **overrides})
    return make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, device=device))  # type: ignore[arg-type]


def test_vllm_on_a_cpu_host_drops_the_gpu_only_flags_and_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    gpu, cpu = _vllm("gpu"), _vllm("cpu")
    expected = gpu.argv()
    at = expected.index("--gpu-memory-utilization")
    del expected[at : at + 2]
    expected.remove("--enable-sleep-mode")
    assert cpu.argv() == expected
    assert set(cpu.dropped_flags()) == CPU_ONLY and gpu.dropped_flags() == {}
    assert cpu.environment()["VLLM_SERVER_DEV_MODE"] == "1"  # /sleep and /wake_up still answer (freeing nothing)


def test_vllm_on_a_cpu_host_without_sleep_mode_drops_only_the_memory_share() -> None:
    assert set(_vllm("cpu", **{"engine.sleepMode": False}).dropped_flags()) == {"--gpu-memory-utilization"}


def test_vllm_on_a_cpu_host_gets_its_kv_cache_in_gib_from_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert _vllm("cpu").environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the key's default
    assert _vllm("cpu", **{"engine.cpuKvCacheGib": 4}).environment()["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "VLLM_CPU_KVCACHE_SPACE" not in _vllm("gpu", **{"engine.cpuKvCacheGib": 4}).environment()


def test_vllm_on_a_cpu_host_is_not_pinned_to_the_first_core_unless_the_agent_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert _vllm("cpu").environment()["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in _vllm("gpu").environment()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert _vllm("cpu").environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_kv_cache_size_in_the_agents_environment_wins_over_the_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    cpu = _vllm("cpu", **{"engine.cpuKvCacheGib": 4})
    assert cpu.environment()["VLLM_CPU_KVCACHE_SPACE"] == "8"
    assert "VLLM_CPU_KVCACHE_SPACE=8 GiB" in cpu.dropped_flags()["--gpu-memory-utilization"]


def test_the_simulator_on_a_cpu_host_keeps_every_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    pool = stacks.pool(**{"engine.sleepMode": True})
    sims = [make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1, device=d)) for d in ("gpu", "cpu")]
    assert sims[0].argv() == sims[1].argv() and CPU_ONLY <= set(sims[1].argv())
    assert sims[1].dropped_flags() == {} and "VLLM_CPU_KVCACHE_SPACE" not in sims[1].environment()


def test_the_simulated_cpu_build_gets_the_flags_and_kv_cache_of_vllm_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cpu = _vllm("cpu", **{"engine.cpuKvCacheGib": 2})
    sim = make_launcher(
        stacks.pool(**{"engine.sleepMode": True, "engine.cpuKvCacheGib": 2, "engine.sim.gpuProfile": "cpu-tiny"}),
        LaunchConfig(host="127.0.0.1", port=1, device="cpu"),
    )
    assert set(sim.dropped_flags()) == set(cpu.dropped_flags()) == CPU_ONLY
    assert not CPU_ONLY & set(sim.argv())
    assert sim.environment()["VLLM_CPU_KVCACHE_SPACE"] == "2" and sim.environment()["VLLM_SERVER_DEV_MODE"] == "1"


def test_a_pool_with_its_own_model_facts_passes_them_to_the_simulator() -> None:
    facts = {"parameters": 840448, "layers": 2, "hiddenSize": 128, "kvHeads": 2, "headDim": 32, "vocabSize": 4253}
    pool = stacks.pool(**{"model": "/models/tiny-qwen", "modelFacts": facts})
    argv = make_launcher(pool, LaunchConfig(host="127.0.0.1", port=1)).argv()
    assert json.loads(argv[argv.index("--model-facts") + 1])["hidden_size"] == 128
    assert "--model-facts" not in make_launcher(stacks.pool(), LaunchConfig(host="127.0.0.1", port=1)).argv()
