"""LoRA adapters through the gateway with the openai client: an adapter's requests go only to the replica whose
engine serves it (the other was started before the adapter was added), keep their model name upstream, and a
tenant needs the adapter's own name in its allowedModels."""

from __future__ import annotations

import openai
import pytest

from gateway.endpoints import static_replica_id
from gateway.service import Gateway
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

SQL = {"name": "sql", "source": "acme/qwen-7b-sql-lora"}


async def _knows_adapter(gateway: Gateway) -> bool:
    return any("sql" in view.adapters for view in gateway.endpoints.snapshot("qwen-7b"))


async def test_adapter_requests_reach_only_the_replica_serving_the_adapter(sims: SimFactory) -> None:
    with_lora, without = sims(["--enable-lora", "--lora-modules", "sql=/adapters/sql"], [])
    settings = settings_for([with_lora.url, without.url], **{"pools.0.adapters": [SQL]})
    async with serve(settings) as (url, gateway):
        await async_wait_for(lambda: _knows_adapter(gateway), timeout_s=20, what="the gateway to read /v1/models")
        gold = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0)
        bronze = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["bronze"], max_retries=0)
        try:
            replicas = set()
            for i in range(8):
                raw = await gold.chat.completions.with_raw_response.create(
                    model="sql", messages=[{"role": "user", "content": f"query {i}"}], max_tokens=2
                )
                assert raw.parse().model == "sql"  # the engine answered as the adapter
                replicas.add(raw.headers["x-llmfleet-replica"])
            assert replicas == {static_replica_id("qwen-7b", 0)}
            base = await gold.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert base.model == MODEL
            with pytest.raises(openai.PermissionDeniedError) as denied:  # bronze may use the base model only
                await bronze.chat.completions.create(
                    model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            assert denied.value.status_code == 403
        finally:
            await gold.close()
            await bronze.close()
