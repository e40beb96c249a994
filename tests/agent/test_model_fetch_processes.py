"""The model store with real processes: moto's S3 server, ``llmfleet model push``, agents with simulated engines.

Every process finds S3 the standard boto3 way (``AWS_ENDPOINT_URL``), so nothing in the code under test knows it
talks to moto.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.exceptions import BotoCoreError
from prometheus_client.parser import text_string_to_metric_families

from fleet.protocol.model_manifest import ModelKeys
from fleet.protocol.ports import free_port
from tests.agent.conftest import AgentProc
from tests.support.procs import Procs
from tests.support.stacks import MODEL
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
BUCKET = "llmfleet-test-models"
KEYS = ModelKeys("models", "Qwen/Qwen2.5-7B-Instruct", "main")


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's S3 server as a process on a free port, with a bucket; this test's processes point at it."""
    port = free_port()
    log = (tmp_path / "moto.log").open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "LLMFLEET_MODEL_BUCKET", "LLMFLEET_MODEL_CACHE"):
        monkeypatch.delenv(name, raising=False)
    try:
        client = boto3.client("s3")

        def created() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"moto exited with {server.returncode}")
            client.create_bucket(Bucket=BUCKET)
            return True

        wait_for(created, timeout_s=30, what="moto's S3 server", ignore=(BotoCoreError,))
        yield client
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        log.close()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small fake model: two JSON files and a 12 MB shard (three multipart parts of 5 MiB)."""
    root = tmp_path / "model"
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28}')
    (root / "tokenizer" / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (root / "model.safetensors").write_bytes(os.urandom(12 * 1000 * 1000))
    return root


def push(procs: Procs, model_dir: Path) -> None:
    argv = ["model", "push", "--bucket", BUCKET, str(model_dir), "--model", KEYS.model, "--part-size", "5"]
    proc = procs.start(argv, name="push")
    assert proc.wait(timeout_s=60) == 0, proc.tail()
    assert "pushed Qwen/Qwen2.5-7B-Instruct revision main: 3 files" in proc.text()


def start_fetching_agent(start_agent: Callable[..., AgentProc], stack: Path, replica: str, cache: Path,
                         *extra: str) -> AgentProc:  # fmt: skip
    return start_agent(
        stack, replica, None, "--model-bucket", BUCKET, "--model-cache", str(cache), *extra, wait_ready=False
    )


def metric(agent: AgentProc, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(agent.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_agent_fetches_the_pushed_model_then_serves_it_read_only(
    s3: Any, procs: Procs, model_dir: Path, tmp_path: Path, write_stack: Callable[..., Path], start_agent
) -> None:
    push(procs, model_dir)
    manifest = s3.get_object(Bucket=BUCKET, Key=KEYS.manifest)["Body"].read()
    assert b'"model.safetensors"' in manifest
    cache = tmp_path / "cache"
    local = cache / KEYS.model / "main"
    lock_path = local.with_name("main.lock")
    lock_path.parent.mkdir(parents=True)
    with lock_path.open("a+b") as lock:
        # Holding the node's model lock keeps the agent in its fetching state long enough to look at it.
        fcntl.flock(lock, fcntl.LOCK_EX)
        agent = start_fetching_agent(start_agent, write_stack(), "r0", cache)
        waiting = wait_for(
            lambda: (s := agent.status())["model_store"]["phase"] == "waiting_for_lock" and s,
            timeout_s=30, what="the agent to wait for the model lock", diagnostics=agent.tail,
        )  # fmt: skip
        assert waiting["state"] == "fetching" and agent.readyz() == 503 and waiting["engine_pid"] is None
        fcntl.flock(lock, fcntl.LOCK_UN)
    agent.wait_http("/readyz", timeout_s=40)
    status = agent.status()
    assert status["transitions"][0] == {**status["transitions"][0], "from": "fetching", "event": "fetched"}
    assert status["model_store"]["source"] == "downloaded" and status["model"] == MODEL
    assert status["engine"]["argv"][5] == str(local)  # the engine loads the local copy
    for source in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        copy = local / source.relative_to(model_dir)
        assert hashlib.sha256(copy.read_bytes()).digest() == hashlib.sha256(source.read_bytes()).digest()
        assert stat.S_IMODE(copy.stat().st_mode) == 0o444
    assert stat.S_IMODE(local.stat().st_mode) == 0o555 and stat.S_IMODE((local / "tokenizer").stat().st_mode) == 0o555
    size = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    assert metric(agent, "llmfleet_agent_model_fetched_bytes_total") == size
    assert metric(agent, "llmfleet_agent_model_files_verified_total") == 3
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    answer = httpx.post(f"{status['engine_url']}/v1/completions", json=body, timeout=10, trust_env=False)
    assert answer.status_code == 200 and answer.json()["model"] == MODEL

    second = start_fetching_agent(start_agent, write_stack(), "r1", cache)
    second.wait_http("/readyz", timeout_s=40)
    assert second.status()["model_store"]["source"] == "cached"
    assert metric(second, "llmfleet_agent_model_fetched_bytes_total") == 0
    assert metric(second, "llmfleet_agent_model_fetches_total", result="cached") == 1


def test_a_corrupted_object_fails_the_agent_with_a_reason_naming_the_file(
    s3: Any, procs: Procs, model_dir: Path, tmp_path: Path, write_stack: Callable[..., Path], start_agent
) -> None:
    push(procs, model_dir)
    s3.put_object(Bucket=BUCKET, Key=KEYS.file("tokenizer/tokenizer.json"), Body=b'{"model": {"type": "WPM"}}')
    agent = start_fetching_agent(start_agent, write_stack(), "r0", tmp_path / "cache", "--max-restarts", "0")
    failed = wait_for(
        lambda: (s := agent.status())["state"] == "failed" and s,
        timeout_s=30, what="the agent to fail", diagnostics=agent.tail,
    )  # fmt: skip
    assert failed["last_error"].startswith("model fetch failed: tokenizer/tokenizer.json: sha256 does not match")
    assert failed["engine_pid"] is None and agent.readyz() == 503
    assert metric(agent, "llmfleet_agent_model_checksum_failures_total") == 2
    assert "tokenizer/tokenizer.json: sha256 does not match" in agent.text()


def test_a_model_missing_from_the_store_loads_from_the_hub_only_with_hub_fallback(
    s3: Any, tmp_path: Path, write_stack: Callable[..., Path], start_agent
) -> None:
    del s3  # Used for its server: the bucket is empty.
    strict = start_fetching_agent(start_agent, write_stack(), "r0", tmp_path / "cache", "--max-restarts", "0")
    failed = wait_for(lambda: (s := strict.status())["state"] == "failed" and s, timeout_s=30, what="failed")
    assert "is not in the model store" in failed["last_error"]
    lenient = start_fetching_agent(
        start_agent, write_stack(**{"modelStore.hubFallback": True}), "r1", tmp_path / "cache"
    )
    lenient.wait_http("/readyz", timeout_s=40)
    status = lenient.status()
    assert status["model_store"]["source"] == "hub" and status["engine"]["argv"][5] == KEYS.model


def test_lora_adapters_are_fetched_from_the_store_and_served_by_name(
    s3: Any, procs: Procs, model_dir: Path, tmp_path: Path, write_stack: Callable[..., Path], start_agent
) -> None:
    push(procs, model_dir)
    adapter = tmp_path / "sql-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj", "v_proj"]}')
    (adapter / "adapter_model.safetensors").write_bytes(os.urandom(64 * 1000))
    proc = procs.start(["model", "push", "--bucket", BUCKET, str(adapter), "--model", "acme/sql-lora"], name="push")
    assert proc.wait(timeout_s=60) == 0, proc.tail()
    stack = write_stack(**{"pools.0.adapters": [{"name": "sql", "source": "acme/sql-lora", "rank": 8}]})
    cache = tmp_path / "cache"
    agent = start_fetching_agent(start_agent, stack, "r0", cache)
    agent.wait_http("/readyz", timeout_s=40)
    argv = agent.status()["engine"]["argv"]
    local = cache / "acme/sql-lora" / "main"
    assert argv[argv.index("--lora-modules") + 1] == f"sql={local}"
    assert (local / "adapter_config.json").exists()
    engine = agent.status()["engine_url"]
    models = httpx.get(f"{engine}/v1/models", timeout=10, trust_env=False).json()["data"]
    assert {"id": "sql", "root": str(local), "parent": MODEL}.items() <= models[1].items()
    body = {"model": "sql", "prompt": "hello", "max_tokens": 4}
    answer = httpx.post(f"{engine}/v1/completions", json=body, timeout=10, trust_env=False)
    assert answer.status_code == 200 and answer.json()["model"] == "sql"
