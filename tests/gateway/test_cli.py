"""``llmfleet gateway`` as a process: the local stack's demo key, and keys from a tenant's secret."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from fleet.protocol.keys import DEMO_API_KEY
from tests.gateway.conftest import admin_url
from tests.support.procs import Proc, Procs
from tests.support.stacks import MODEL, write_stack

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
