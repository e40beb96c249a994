"""``llmfleet gateway`` as a process: the local stack's demo key, keys from a tenant's secret, and tokenizers from
the model bucket (moto's server)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import boto3
import httpx
import pytest

from fleet.protocol.keys import DEMO_API_KEY
from tests.gateway.conftest import admin_url
from tests.support.auth import NO_CREDENTIAL_ENV, assert_names_the_ways_out
from tests.support.procs import Proc, Procs
from tests.support.stacks import MODEL, write_stack

TOKENIZER = Path("models/llmfleet-tiny-tokenizer")
QWEN = "Qwen/Qwen2.5-7B-Instruct"  # the preset pools' model
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


async def _chat(url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=BODY, headers=headers) as resp:
            await resp.read()
            return resp.status


async def test_local_stack_demo_key(shared_sim: Proc, gateway_procs: Callable[..., Proc]) -> None:
    gateway = gateway_procs("local", [shared_sim.url])
    assert await _chat(gateway.url, DEMO_API_KEY) == 200
    assert await _chat(gateway.url, "sk-not-a-key") == 401


async def test_tenant_keys_from_secret_env(
    shared_sim: Proc, gateway_procs: Callable[..., Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **{"tenants.0.apiKeysSecret": "tenantKeys:gold"})
    monkeypatch.setenv("LLMFLEET_SECRET_TENANTKEYS_GOLD", json.dumps(["sk-from-secret"]))
    gateway = gateway_procs(stack, [shared_sim.url])
    assert await _chat(gateway.url, "sk-from-secret") == 200


async def test_metrics_and_readiness_answer_on_the_admin_port_and_not_on_the_public_one(
    shared_sim: Proc, gateway_procs: Callable[..., Proc]
) -> None:
    gateway = gateway_procs("local", [shared_sim.url])
    admin = admin_url(gateway)
    assert admin != gateway.url
    async with aiohttp.ClientSession() as session:
        statuses = {}
        for base in (gateway.url, admin):
            for path in ("/metrics", "/readyz", "/healthz"):
                async with session.get(base + path) as resp:
                    statuses[base == admin, path] = resp.status
    assert statuses == {
        (False, "/metrics"): 404,
        (False, "/readyz"): 404,
        (False, "/healthz"): 200,
        (True, "/metrics"): 200,
        (True, "/readyz"): 200,
        (True, "/healthz"): 200,
    }


def test_an_admin_port_equal_to_the_public_port_is_refused(procs: Procs) -> None:
    proc = procs.start(["gateway", "--stack", "local", "--port", "18080", "--admin-port", "18080"], name="gw")
    assert proc.wait(timeout_s=30) == 2
    assert "the admin port must differ from the public port 18080" in proc.text()


def test_a_gateway_with_a_control_plane_but_no_credential_or_auth_none_exits_2(procs: Procs) -> None:
    argv = ["gateway", "--stack", "local", "--port", "0", "--admin-port", "0", "--control-plane", "http://127.0.0.1:9"]
    proc = procs.start(argv, name="gw", env=NO_CREDENTIAL_ENV)
    assert proc.wait(timeout_s=30) == 2
    assert_names_the_ways_out(proc.text())


def test_a_gateway_with_auth_none_or_static_replicas_only_starts_without_a_credential(
    procs: Procs, shared_sim: Proc
) -> None:
    base = ["gateway", "--stack", "local", "--port", "0", "--admin-port", "0"]
    with_cp = [*base, "--control-plane", "http://127.0.0.1:9", "--auth", "none"]
    open_cp = procs.start(with_cp, name="gw-open", env=NO_CREDENTIAL_ENV)
    static = procs.start([*base, "--replica", shared_sim.url], name="gw-static", env=NO_CREDENTIAL_ENV)
    for proc in (open_cp, static):
        proc.wait_url("listening on")
    assert "control auth is OFF" in open_cp.text() and "control auth is OFF" not in static.text()


def test_a_gateway_given_the_model_bucket_tokenizes_a_pushed_model_and_routes_an_unpushed_one_by_load(
    procs: Procs, gateway_procs: Callable[..., Proc], moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "LLMFLEET_MODEL_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    boto3.client("s3").create_bucket(Bucket="gw-models")
    push = procs.start(["model", "push", "--bucket", "gw-models", str(TOKENIZER), "--model", QWEN], name="push")
    assert push.wait(timeout_s=60) == 0, push.tail()
    routing = {"scorers": [{"name": "queue-depth", "weight": 1}, {"name": "kv-cache", "weight": 2}]}
    stack = write_stack(
        tmp_path / "Pulumi.kv.yaml",
        "gateway",
        **{"gateway.routing": routing, "pools.0.engine.kvEvents": True, "pools.1.engine.kvEvents": True},
        **{"pools.1.model": "meta-llama/Llama-3.1-8B-Instruct"},
    )
    gateway = gateway_procs(stack, [], "--model-bucket", "gw-models", "--tokenizer-cache", str(tmp_path / "tok"))
    metrics = httpx.get(admin_url(gateway) + "/metrics").text
    assert 'llmfleet_gateway_prompt_tokens_available{pool="qwen-7b"} 1.0' in metrics
    assert 'llmfleet_gateway_prompt_tokens_available{pool="small"} 0.0' in metrics
    assert "s3://gw-models/models/meta-llama/Llama-3.1-8B-Instruct/main/manifest.json is missing" in gateway.text()
    assert (tmp_path / "tok" / QWEN / "main" / "tokenizer.json").is_file()
