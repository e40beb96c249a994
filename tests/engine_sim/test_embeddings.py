"""A pooling simulator (``--runner pooling``): ``/v1/embeddings`` as vLLM 0.33 serves it, for the real ``openai``
client and in both encodings, and no generation route."""

from __future__ import annotations

import argparse
import base64
import math
import struct

import openai
import pytest

from engine_sim.cli import add_arguments, build
from tests.engine_sim.conftest import StartSim

HIDDEN = 3584  # Qwen2.5-7B's hidden size: the simulated model's embedding dimension


async def test_the_openai_client_gets_one_unit_vector_per_input_the_same_for_the_same_input(
    start_sim: StartSim,
) -> None:
    sim = await start_sim(runner="pooling")
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0)
    try:
        first = await client.embeddings.create(model="qwen", input=["a tide table", "a neap tide", "a tide table"])
        again = await client.embeddings.create(model="qwen", input="a neap tide")
    finally:
        await client.close()
    vectors = [d.embedding for d in first.data]
    assert [d.index for d in first.data] == [0, 1, 2] and all(len(v) == HIDDEN for v in vectors)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert again.data[0].embedding == pytest.approx(vectors[1], abs=1e-6)  # float32 on the wire (base64)
    assert first.usage.prompt_tokens == first.usage.total_tokens > 0
    assert first.model == "qwen" and first.object == "list"


async def test_floats_and_base64_carry_the_same_vector_and_the_body_is_vllms(start_sim: StartSim) -> None:
    sim = await start_sim(runner="pooling")
    floats = (await sim.client.post("/v1/embeddings", json={"input": [1, 2, 3]})).json()
    packed = (await sim.client.post("/v1/embeddings", json={"input": [1, 2, 3], "encoding_format": "base64"})).json()
    assert set(floats) == {"id", "object", "created", "model", "data", "usage"} and floats["id"].startswith("embd-")
    assert floats["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 3,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack(f"={HIDDEN}f", raw)) == pytest.approx(floats["data"][0]["embedding"], abs=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": " tide" * 9000}, 400, "input"),  # over max_model_len (8192)
        ({"input": []}, 400, "input"),
        ({"input": [1, "a"]}, 400, "input"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "input"),
        ({"input": "hi", "encoding_format": "binary"}, 400, "encoding_format"),
        ({"input": "hi", "dimensions": 256}, 400, "dimensions"),
        ({"input": "hi", "model": "other"}, 404, "model"),
    ],
    ids=["too-long", "empty", "mixed", "chat-form", "encoding", "dimensions", "model"],
)
async def test_bad_bodies_get_vllms_error_shape(
    start_sim: StartSim, body: dict[str, object], status: int, param: str
) -> None:
    sim = await start_sim(runner="pooling")
    response = await sim.client.post("/v1/embeddings", json=body)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param


async def test_a_pooling_server_serves_no_generation_and_a_generative_one_no_embeddings(start_sim: StartSim) -> None:
    pooling, generative = await start_sim(runner="pooling"), await start_sim()
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    assert (await pooling.client.post("/v1/chat/completions", json=chat)).status_code == 404
    assert (await generative.client.post("/v1/embeddings", json={"input": "hi"})).status_code == 404


def test_the_runner_flag_is_vllms() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert build(parser.parse_args(["serve", "Qwen/Qwen2.5-7B-Instruct", "--runner", "pooling"])).runner == "pooling"
    assert build(parser.parse_args(["serve", "Qwen/Qwen2.5-7B-Instruct"])).runner == "generate"
