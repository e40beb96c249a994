"""The HTTP surface through a real aiohttp server on loopback: framing, errors, load behaviour."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from engine_sim.tokenizer import encode
from fleet.protocol import promtext
from tests.engine_sim.conftest import SimHandle, StartSim, sse_events
from tests.support.wait import async_wait_for

CHAT = "/v1/chat/completions"
ABORTED = {"finished_reason": "abort"}


def _chat(content: str, max_tokens: int | None = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "qwen", "messages": [{"role": "user", "content": content}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def _scrape(sim: SimHandle) -> dict[str, list[promtext.Sample]]:
    return promtext.parse(await sim.metrics_text())


async def test_openai_client_works_for_chat_completions_and_streaming(start_sim: StartSim) -> None:
    sim = await start_sim()
    client = openai.AsyncOpenAI(base_url=f"{sim.base_url}/v1", api_key="unused", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["qwen"]

        chat = await client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "Say hello"}], max_tokens=12
        )
        assert chat.id.startswith("chatcmpl-") and chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 12
        assert len(encode(chat.choices[0].message.content or "")) == 12

        completion = await client.completions.create(model="qwen", prompt="Once upon a time", max_tokens=5)
        assert completion.id.startswith("cmpl-") and completion.usage is not None
        assert completion.usage.prompt_tokens == len(encode("Once upon a time"))
        assert len(encode(completion.choices[0].text)) == 5

        stream = await client.chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "Stream please"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(encode(text)) == 6
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6

        cstream = await client.completions.create(model="qwen", prompt="abc", max_tokens=4, stream=True)
        pieces = [c async for c in cstream]
        assert len(pieces) == 4 and pieces[-1].choices[0].finish_reason == "length"
    finally:
        await client.close()


async def test_sse_framing_matches_vllm(start_sim: StartSim) -> None:
    sim = await start_sim()
    events = await sse_events(sim.client, CHAT, _chat("hi", 3, stream=True))
    assert events[-1] == "[DONE]"
    first, *middle, last, done = events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    assert [e["choices"][0]["finish_reason"] for e in middle] == [None, None]
    assert last["choices"][0]["finish_reason"] == "length"
    assert len({e["id"] for e in events[:-1]}) == 1
    with_usage = await sse_events(sim.client, CHAT, _chat("hi", 3, stream=True, stream_options={"include_usage": True}))
    usage_chunk = with_usage[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 3
    assert usage_chunk["usage"]["total_tokens"] == usage_chunk["usage"]["prompt_tokens"] + 3


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        pytest.param(_chat("x " * 9000), 400, "input_tokens", id="prompt-longer-than-max-model-len"),
        pytest.param(_chat("hi", 9000), 400, "max_tokens", id="max-tokens-above-max-model-len"),
        pytest.param({**_chat("hi"), "model": "other"}, 404, "model", id="unknown-model"),
        pytest.param({"model": "qwen", "messages": []}, 400, "messages", id="no-messages"),
        pytest.param(_chat("x " * 9000, stream=True), 400, "input_tokens", id="streaming-validation-is-json"),
    ],
)
async def test_errors_use_vllm_status_and_json_shape(
    start_sim: StartSim, body: dict[str, Any], status: int, param: str
) -> None:
    sim = await start_sim()
    response = await sim.client.post(CHAT, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (status, param)
    if param == "input_tokens":
        assert error["message"].startswith("This model's maximum context length is 8192 tokens.")


async def test_invalid_json_is_a_400_in_vllms_validation_shape(start_sim: StartSim) -> None:
    sim = await start_sim()
    response = await sim.client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and (error["type"], error["param"]) == ("Bad Request", "body.1")
    assert error["message"].startswith("1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1'")


async def test_sampling_parameters_are_checked_in_vllms_words(start_sim: StartSim) -> None:
    sim = await start_sim()
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [({"temperature": -1}, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"),
             ({"top_p": 0}, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)"),
             ({"temperature": 0, "n": 2}, "n must be 1 when using greedy sampling, got 2.")]  # fmt: skip
    for extra, message in cases:
        response = await sim.client.post(CHAT, json={**body, **extra})
        assert response.status_code == 400 and response.json()["error"]["message"] == message


async def test_a_missing_field_or_route_answers_as_vllms_fastapi_app_does(start_sim: StartSim) -> None:
    sim = await start_sim()
    missing = await sim.client.post(CHAT, json={"model": "qwen", "max_tokens": 4})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "body.messages"
    nowhere = await sim.client.post("/v1/embeddings", json={"model": "qwen", "input": "hi"})
    assert (nowhere.status_code, nowhere.json()) == (404, {"detail": "Not Found"})


async def test_tokenize_counts_what_generation_counts(start_sim: StartSim) -> None:
    sim = await start_sim()
    messages = [{"role": "user", "content": "Name three rivers."}]
    tokens = (await sim.client.post("/tokenize", json={"model": "qwen", "messages": messages})).json()
    chat = (await sim.client.post(CHAT, json={"model": "qwen", "messages": messages, "max_tokens": 2})).json()
    assert tokens["count"] == len(tokens["tokens"]) == chat["usage"]["prompt_tokens"]
    assert tokens["token_strs"] is None and tokens["max_model_len"] == 8192


async def test_logprobs_have_vllms_shapes(start_sim: StartSim) -> None:
    sim = await start_sim()
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    chat = (await sim.client.post(CHAT, json={**body, "logprobs": True, "top_logprobs": 2})).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["token"] == c["token"] and c["bytes"] == list(c["token"].encode()) for c in content)
    text = chat["choices"][0]["message"]["content"]
    assert "".join(c["token"] for c in content) == text
    plain = (await sim.client.post(CHAT, json=body)).json()
    assert plain["choices"][0]["logprobs"] is None and plain["system_fingerprint"].startswith("vllm-")


async def test_max_tokens_beyond_the_context_is_clamped_not_rejected(start_sim: StartSim) -> None:
    sim = await start_sim(max_model_len=512, num_gpu_blocks_override=64)
    body = {"model": "qwen", "prompt": list(range(500)), "max_tokens": 100}
    response = await sim.client.post("/v1/completions", json=body)
    assert response.status_code == 200
    data = response.json()
    assert data["usage"]["completion_tokens"] == 12 and data["choices"][0]["finish_reason"] == "length"


async def test_health_version_models_and_load(start_sim: StartSim) -> None:
    sim = await start_sim()
    health = await sim.client.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert (await sim.client.get("/version")).json() == {"version": "0.33.0"}
    card = (await sim.client.get("/v1/models")).json()["data"][0]
    assert (card["id"], card["owned_by"], card["max_model_len"]) == ("qwen", "vllm", 8192)
    assert (await sim.client.get("/load")).json() == {"server_load": 0}


async def _stream_text(sim: SimHandle, body: dict[str, Any]) -> str:
    events = await sse_events(sim.client, "/v1/completions", {**body, "stream": True})
    return "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])


async def test_kv_usage_rises_and_preemptions_occur_when_contexts_exceed_the_cache(start_sim: StartSim) -> None:
    # 48 blocks = 768 tokens of KV; eight requests of 64 + 160 tokens need 8 x 14 = 112 blocks.
    sim = await start_sim(time_scale=20.0, num_gpu_blocks_override=48, max_model_len=512)
    peak = 0.0
    bodies = [{"model": "qwen", "prompt": [i * 1000 + j for j in range(64)], "max_tokens": 160} for i in range(8)]
    tasks = [asyncio.create_task(_stream_text(sim, b)) for b in bodies]
    while not all(t.done() for t in tasks):
        peak = max(peak, promtext.gauge_value(await _scrape(sim), "vllm:kv_cache_usage_perc"))
        await asyncio.sleep(0.01)
    texts = await asyncio.gather(*tasks)
    assert [len(encode(t)) for t in texts] == [160] * 8  # nobody lost tokens to a preemption
    samples = await _scrape(sim)
    assert peak > 0.8
    assert promtext.counter_value(samples, "vllm:num_preemptions") >= 1
    assert promtext.gauge_value(samples, "vllm:kv_cache_usage_perc") == 0.0
    assert promtext.counter_value(samples, "vllm:request_success", {"finished_reason": "length"}) == 8


async def test_a_long_prompt_delays_other_streams_tokens_by_chunked_prefill(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=4.0)
    arrivals: list[float] = []
    long_sent = asyncio.Event()

    async def watch() -> None:
        body = {"model": "qwen", "prompt": "short", "max_tokens": 120, "stream": True}
        async with sim.client.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
                    if len(arrivals) == 20:
                        long_sent.set()

    watcher = asyncio.create_task(watch())
    await long_sent.wait()
    # 8000 prompt tokens at a 2048-token budget: four ~150 ms (model) chunked steps, decodes squeezed in.
    long = await sim.client.post(
        "/v1/completions", json={"model": "qwen", "prompt": list(range(8000)), "max_tokens": 1}
    )
    assert long.status_code == 200
    await watcher
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    median = gaps[len(gaps) // 2]
    assert gaps[-1] > 5 * median
    itl = promtext.histogram_buckets(await _scrape(sim), "vllm:inter_token_latency_seconds")
    slow = itl[-1][1] - dict(itl)[0.1]
    assert slow >= 3  # the decodes that shared a step with a 2048-token chunk took >100 ms each


async def test_a_repeated_long_prefix_hits_the_cache_and_lowers_ttft(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=2.0, prompt_details=True)
    system = {"role": "system", "content": "You answer briefly and precisely. " * 700}

    async def ttft(question: str) -> tuple[float, int]:
        body = {"model": "qwen", "messages": [system, {"role": "user", "content": question}], "max_tokens": 2}
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        start, first = time.monotonic(), None
        usage: dict[str, Any] = {}
        async with sim.client.stream("POST", CHAT, json=body) as response:
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.monotonic()
                if '"usage"' in line:
                    usage = httpx.Response(200, content=line[6:]).json()["usage"]
        assert first is not None
        return first - start, usage["prompt_tokens_details"]["cached_tokens"]

    cold, cold_cached = await ttft("What is a KV cache?")
    warm, warm_cached = await ttft("And what is a block?")
    samples = await _scrape(sim)
    assert cold_cached == 0 and warm_cached > 4000
    assert promtext.counter_value(samples, "vllm:prefix_cache_hits") == warm_cached
    assert warm < cold / 2


async def test_client_disconnect_aborts_the_request_and_frees_its_blocks(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=1.0)
    body = {"model": "qwen", "prompt": list(range(3000)), "max_tokens": 5000, "stream": True}
    async with sim.client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                break

    async def aborted() -> dict[str, list[promtext.Sample]] | None:
        samples = await _scrape(sim)
        return samples if promtext.counter_value(samples, "vllm:request_success", ABORTED) == 1 else None

    samples = await async_wait_for(aborted, timeout_s=10, interval_s=0.02, what="the request counted as aborted")
    assert promtext.gauge_value(samples, "vllm:kv_cache_usage_perc") == 0.0
    assert promtext.gauge_value(samples, "vllm:num_requests_running") == 0


async def test_draining_rejects_new_requests_keeps_health_and_finishes_in_flight(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=10.0)
    in_flight = asyncio.create_task(_stream_text(sim, {"model": "qwen", "prompt": "go", "max_tokens": 100}))
    await async_wait_for(lambda: sim.engine.scheduler.num_running > 0, timeout_s=10, interval_s=0.005, what="running")
    sim.engine.begin_drain()
    rejected = await sim.client.post(CHAT, json=_chat("late"))
    assert (
        rejected.status_code == 500
        and rejected.json()["error"]["message"] == "cannot schedule new futures after shutdown"
    )
    assert (await sim.client.get("/health")).status_code == 200
    assert len(encode(await in_flight)) == 100
    await asyncio.wait_for(sim.engine.wait_idle(), 5)
