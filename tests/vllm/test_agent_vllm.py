"""The agent on the real vLLM: it launches ``vllm serve`` from the pool spec, reports it ready and loaded from the
engine's own ``/metrics``, drains it on SIGTERM within the budget, and stops one that ignores SIGTERM while it is
still starting. One engine serves the module's tests, in file order; the last test starts a second and stops it
while it starts. On the simulator (``LLMFLEET_TIER_ENGINE=sim``) the same tests run against the simulated CPU build;
only the launch command differs, and the simulator exits on that SIGTERM where vLLM ignores it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.actuators.local_state import pid_alive
from tests.support.procs import Procs
from tests.support.wait import wait_for
from tests.vllm.conftest import MODEL_DIR, SERVED, TIER_ENGINE, vllm_stack
from tests.vllm.engines import Replica, start_replica

LONG = 1500  # tokens: a few seconds of decoding for the tiny model on one core


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Sleep mode on, as a GPU pool would have it: on this CPU the agent must leave the flag out to start at all.
    return vllm_stack(tmp_path_factory.mktemp("stack") / "Pulumi.vllm-agent.yaml", **{"pools.0.engine.sleepMode": True})


@pytest.fixture(scope="module")
def replica(module_procs: Procs, stack: Path) -> Iterator[Replica]:
    yield start_replica(module_procs, stack, "r0")


class Stream(threading.Thread):
    """One streamed completion of ``max_tokens`` straight to an engine, read to its end in a thread."""

    def __init__(self, url: str, max_tokens: int = LONG) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.lines: list[str] = []
        self.first = threading.Event()
        self.status = 0

    def run(self) -> None:
        body = {"model": SERVED, "prompt": "the fleet", "max_tokens": self.max_tokens, "stream": True,
                "ignore_eos": True, "temperature": 0}  # fmt: skip
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120) as answer:
            self.status = answer.status_code
            for line in answer.iter_lines():
                if line:
                    self.lines.append(line)
                    self.first.set()

    def finish_reasons(self) -> list[str]:
        return [line.split('"finish_reason":"')[1].split('"')[0] for line in self.lines if '"finish_reason":"' in line]


def test_the_agent_launches_vllm_from_the_pool_and_reports_it_ready(replica: Replica) -> None:
    status = replica.status()
    assert status["state"] == "ready" and status["ready"] is True
    engine: dict[str, Any] = status["engine"]
    assert engine["kind"] == TIER_ENGINE and engine["version"] == "0.32.0"  # read from the engine's own /version
    argv = engine["argv"]
    assert argv[argv.index("serve") + 1] == str(MODEL_DIR)
    if TIER_ENGINE == "vllm":  # the launch command is the engine's own: `vllm serve`, not `llmfleet sim serve`
        assert argv[0].endswith("/vllm") and argv[1] == "serve"
    assert argv[argv.index("--served-model-name") + 1] == SERVED
    models = httpx.get(f"{replica.engine_url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [SERVED] and models["data"][0]["max_model_len"] == 2048
    assert status["start"]["ready_s"] > 0 and status["start"]["compile_s"] > 0  # the CPU's compiling warm-up
    # No GPU here: only flags the CPU build accepts, and the agent says which it left out.
    assert engine["device"] == "cpu"
    assert set(engine["dropped_flags"]) == {"--gpu-memory-utilization", "--enable-sleep-mode"}
    assert "--gpu-memory-utilization" not in argv and "--enable-sleep-mode" not in argv
    assert engine["version_pinned"] == "0.32.0" and engine["version_matches"] is True


def test_the_agent_reports_load_read_from_the_engines_metrics(replica: Replica) -> None:
    # Four streams, about 20 s of decoding on a quiet machine: with two (about 10 s) a CI rehearsal's agent never
    # reported a running request within 60 s, though it scraped the engine about every second meanwhile (not
    # understood).
    streams = [Stream(replica.engine_url) for _ in range(4)]
    for stream in streams:
        stream.start()

    def loaded() -> dict[str, Any] | None:
        load: dict[str, Any] = replica.status()["load"]
        return load if (load["running"] or 0) >= 1 else None

    load = wait_for(loaded, timeout_s=60, what="the agent's load showing the engine's running requests")
    assert load["kv_usage"] is not None and load["waiting"] is not None
    for stream in streams:
        stream.join(120)
    assert all(s.finish_reasons() == ["length"] for s in streams)


def test_sleep_and_wake_on_the_cpu_build_answer_as_on_a_gpu_but_free_nothing(replica: Replica) -> None:
    assert replica.post("/sleep").status_code == 202
    wait_for(lambda: replica.status()["state"] == "sleeping" and _engine_asleep(replica), timeout_s=60,
             what="the engine asleep")  # fmt: skip
    assert replica.readyz() == 503
    log = Path(replica.status()["engine"]["log"]).read_text(errors="replace")
    assert "sleep mode is not supported on CPU" in log  # vLLM's CPU worker ignores the sleep it answered
    assert replica.post("/wake").status_code == 202
    # The agent wakes it and asks the greedy check again: the same answer as before the sleep, then ready.
    wait_for(lambda: replica.readyz() == 200, timeout_s=60, what="ready again after the wake")
    assert httpx.get(f"{replica.engine_url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}


def _engine_asleep(replica: Replica) -> bool:
    return bool(httpx.get(f"{replica.engine_url}/is_sleeping", timeout=5).json()["is_sleeping"])


def test_sigterm_drains_the_engine_within_its_budget_and_the_stream_in_flight_finishes(replica: Replica) -> None:
    stream = Stream(replica.engine_url)
    stream.start()
    assert stream.first.wait(60), "no first token"
    started = time.monotonic()
    replica.send(signal.SIGTERM)
    wait_for(lambda: replica.get("/readyz").status_code == 503, timeout_s=10, what="readiness off while draining")
    code = replica.wait(45)  # the stack's drain.graceSeconds is 40
    took = time.monotonic() - started
    stream.join(30)
    assert code == 0, replica.tail()
    assert stream.status == 200 and stream.finish_reasons() == ["length"] and stream.lines[-1] == "data: [DONE]"
    assert took < 40, f"the drain took {took:.1f} s"
    assert "SIGKILL" not in replica.text(), replica.tail()  # the engine exited on its own after its drain
    assert not any(pid_alive(pid) for pid in replica.extra_pids)


def test_an_engine_that_ignores_sigterm_while_it_starts_is_stopped_without_waiting_out_the_grace(
    module_procs: Procs, stack: Path
) -> None:
    starting = start_replica(module_procs, stack, "r1", wait_ready=False)

    def engine_log() -> str | None:
        status = starting.status()
        log = status["engine"]["log"]
        text = Path(log).read_text(errors="replace") if log and Path(log).exists() else ""
        # The engine core is being spawned: vLLM ignores SIGTERM from here until it serves.
        return text if status["engine_pid"] and "EngineCore" in text else None

    wait_for(engine_log, timeout_s=120, interval_s=0.2, what="the engine core starting")
    assert starting.status()["state"] == "starting"
    (group,) = starting.engine_pids()
    started = time.monotonic()
    starting.send(signal.SIGTERM)
    try:
        code = starting.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent still waits for its starting engine 30 s after SIGTERM:\n{starting.tail()}")
    took = time.monotonic() - started
    assert code == 0 and took < 20, (code, took, starting.tail())
    wait_for(lambda: not pid_alive(group), timeout_s=10, what="the engine's process group gone")
