"""``llmfleet gateway`` as a process: the local stack's demo key, and keys from a tenant's secret."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from fleet.validate import DEMO_API_KEY
from tests.support.procs import Proc
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
