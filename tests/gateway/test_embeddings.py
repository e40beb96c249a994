"""Embeddings through the gateway: a pool with ``engine.runner: pooling`` beside a generative one, two simulator
processes, the real ``openai`` client with a tenant's key. Embeddings reach only the pooling pool and chat only the
generative one; the other way round is a 400 in OpenAI's error shape that says why; the gateway counts both."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest

from fleet.protocol import promtext
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.gateway.conftest import SimFactory, serve
from tests.support.stacks import KEYS, MODEL, spec
from tests.support.wait import async_wait_for

EMBED = "qwen-embed"


def _pool(name: str, served: str, **engine: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "servedModelName": served,
        "engine": {"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192, **engine},
    }


def _requests(gateway: Gateway, model: str, status: str) -> float:
    samples = promtext.parse(gateway.metrics.render().decode())
    try:
        return promtext.counter_value(samples, "llmfleet_gateway_requests", {"model": model, "status": status})
    except KeyError:
        return 0.0


async def test_embeddings_reach_the_pooling_pool_and_chat_the_generative_one(sims: SimFactory) -> None:
    generative, pooling = sims([], ["--runner", "pooling", "--served-model-name", EMBED])
    stack = spec("gateway", pools=[_pool("qwen-7b", MODEL), _pool("embed", EMBED, runner="pooling")])
    settings = GatewaySettings(
        spec=stack, static_replicas={"qwen-7b": [generative.url], "embed": [pooling.url]}, access_log=False
    )
    async with serve(settings) as (url, gateway):
        await async_wait_for(lambda: gateway.endpoints.routable("embed") == 1, timeout_s=10, what="embed ready")
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0)
        try:
            embedded = await client.embeddings.create(model=EMBED, input=["a neap tide", "a king tide"])
            chat = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            with pytest.raises(openai.BadRequestError) as to_embedder:
                await client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.BadRequestError) as to_generator:
                await client.embeddings.create(model=MODEL, input="hi")
        finally:
            await client.close()
        assert [len(d.embedding) for d in embedded.data] == [3584, 3584]
        assert math.isclose(math.fsum(x * x for x in embedded.data[0].embedding), 1.0, rel_tol=1e-4)
        assert embedded.usage.prompt_tokens > 0 and chat.choices[0].message.content
        refused = to_embedder.value.body
        assert isinstance(refused, dict) and "embedding model" in refused["message"] and refused["param"] == "model"
        assert "/v1/embeddings" in refused["message"]
        assert "has no embeddings" in str(to_generator.value)
        assert _requests(gateway, EMBED, "200") == 1 and _requests(gateway, MODEL, "200") == 1
        assert _requests(gateway, EMBED, "400") == 1 and _requests(gateway, MODEL, "400") == 1
