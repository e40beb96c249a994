"""Real simulator processes: startup, SIGTERM drain and abort, crashes, flag compatibility with vLLM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.engine_sim.conftest import SpawnSim
from tests.support.procs import Proc
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

STREAM = {"model": "qwen", "prompt": "drain me", "stream": True}


def _stream_in_thread(
    base_url: str, body: dict[str, object], out: list[str], started: threading.Event
) -> threading.Thread:
    def read() -> None:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line:
                    out.append(line)
                    started.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _sigterm_mid_stream(sim: Proc, max_tokens: int) -> tuple[list[str], threading.Thread]:
    """Start one streamed completion and SIGTERM the simulator once it streams: (its lines so far, the reader)."""
    sim.wait_http("/health", timeout_s=20, interval_s=0.02)
    lines: list[str] = []
    started = threading.Event()
    reader = _stream_in_thread(sim.url, {**STREAM, "max_tokens": max_tokens}, lines, started)
    assert started.wait(10)
    sim.send(signal.SIGTERM)
    return lines, reader


def test_port_refuses_connections_while_loading_then_serves(spawn_sim: SpawnSim) -> None:
    sim = spawn_sim("--startup-seconds", "1.5")
    sim.wait_log("Loading weights", timeout_s=20)
    loading_seen = time.monotonic()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{sim.url}/health", timeout=1.0)
    ready = sim.wait_http("/health", timeout_s=20, interval_s=0.02)
    assert ready - loading_seen > 0.8
    response = httpx.post(f"{sim.url}/v1/completions", json={"model": "qwen", "prompt": "hi", "max_tokens": 3})
    assert response.json()["usage"]["completion_tokens"] == 3


TINY_FACTS = json.dumps({"parameters": 840448, "layers": 2, "hidden_size": 128, "kv_heads": 2, "head_dim": 32,
                         "vocab_size": 4253, "tied_embeddings": True, "max_position": 4096})  # fmt: skip


@pytest.mark.parametrize(("profile", "serves"), [("a100-80gb", False), ("cpu-tiny", True)])
def test_a_sigterm_while_starting_ends_the_start_except_on_the_cpu_build(
    spawn_sim: SpawnSim, profile: str, serves: bool
) -> None:
    """The GPU release's start ends at a SIGTERM (exit 0); vLLM's CPU build ignores it and serves (measured, and held
    by the differential suite), until the next SIGTERM drains it."""
    sim = spawn_sim("--startup-seconds", "1.5", "--gpu-profile", profile, "--model-facts", TINY_FACTS)
    sim.wait_log("Loading weights" if profile != "cpu-tiny" else "Warming up model", timeout_s=20)
    sim.send(signal.SIGTERM)
    if not serves:
        assert sim.process.wait(timeout=10) == 0
        return
    sim.wait_http("/health", timeout_s=20, interval_s=0.05)
    sim.send(signal.SIGTERM)
    assert sim.process.wait(timeout=10) == 0


def test_sigterm_with_a_shutdown_timeout_lets_in_flight_streams_finish(spawn_sim: SpawnSim) -> None:
    # Slow enough (a few seconds) that the stream is still running while the checks below are made.
    sim = spawn_sim("--startup-seconds", "0", "--time-scale", "0.5", "--shutdown-timeout", "20")
    lines, reader = _sigterm_mid_stream(sim, max_tokens=150)
    sim.wait_log("shutdown triggered", timeout_s=20)
    late = httpx.post(f"{sim.url}/v1/completions", json={"model": "qwen", "prompt": "x", "max_tokens": 2})
    assert late.status_code == 500 and late.json()["error"]["message"] == "cannot schedule new futures after shutdown"
    assert httpx.get(f"{sim.url}/health").status_code == 200
    reader.join(20)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert len(chunks) == 150 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sim.wait(10) == 0


def test_sigterm_without_a_timeout_aborts_in_flight_streams(spawn_sim: SpawnSim) -> None:
    sim = spawn_sim("--startup-seconds", "0", "--shutdown-timeout", "0")
    lines, reader = _sigterm_mid_stream(sim, max_tokens=4000)
    reader.join(10)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "abort"
    assert sim.wait(10) == 0


def test_an_engine_crash_turns_health_503_then_exits_nonzero(spawn_sim: SpawnSim) -> None:
    sim = spawn_sim("--startup-seconds", "0", "--fault-crash-at-seconds", "0.3", "--fault-exit-delay", "1.0")
    sim.wait_http("/health", timeout_s=20, interval_s=0.02)

    def unhealthy() -> int | None:
        status = sim.get("/health").status_code
        return status if status != 200 else None

    assert wait_for(unhealthy, timeout_s=5, interval_s=0.02, what="/health to stop answering 200") == 503
    assert sim.wait(10) == 1


def test_dying_mid_stream_resets_the_connection_without_done(spawn_sim: SpawnSim) -> None:
    sim = spawn_sim("--startup-seconds", "0", "--fault-die-mid-stream-after-tokens", "5")
    sim.wait_http("/health", timeout_s=20, interval_s=0.02)
    lines: list[str] = []
    with pytest.raises(httpx.TransportError):
        with httpx.stream("POST", f"{sim.url}/v1/completions", json={**STREAM, "max_tokens": 50}) as r:
            for line in r.iter_lines():
                lines.append(line)
    assert "data: [DONE]" not in lines
    assert sim.wait(10) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--swap-space", "4"], "unrecognized arguments: --swap-space"),
        (["--gpu-profile", "cpu-demo"], "No available memory for the cache blocks"),
        (["--lora-modules", "sql=/adapters/sql"], "--lora-modules needs --enable-lora"),
    ],
)
def test_flags_vllm_rejects_fail_at_startup(flags: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "engine_sim", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "0", *flags]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and message in result.stderr


def test_unknown_models_need_model_facts(spawn_sim: SpawnSim) -> None:
    facts = {
        "parameters": 1.0e9, "layers": 16, "hidden_size": 2048, "kv_heads": 8, "head_dim": 64,
        "vocab_size": 32000, "tied_embeddings": True, "max_position": 4096,
    }  # fmt: skip
    sim = spawn_sim("--startup-seconds", "0", "--model-facts", json.dumps(facts), model="acme/tiny-1b")
    sim.wait_http("/health", timeout_s=20, interval_s=0.02)
    assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["root"] == "acme/tiny-1b"
    result = subprocess.run(
        [sys.executable, "-m", "engine_sim", "serve", "acme/tiny-1b"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1 and "--model-facts" in result.stderr


def test_llmfleet_sim_serve_is_the_same_command(spawn_sim: SpawnSim) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", "sim", "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    for flag in ("--served-model-name", "--max-num-batched-tokens", "--no-enable-prefix-caching", "--time-scale"):
        assert flag in result.stdout
