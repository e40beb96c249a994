"""Malformed input over HTTP: generated OpenAI and Anthropic bodies at a simulator process are answered, never with
a 5xx.

Every answer is a 200 (a JSON answer, or an SSE stream that ends as its API ends one and carries no error event)
or a 4xx in vLLM's error shape, ``{"error": {"message", "type", "param", "code": <status>}}``, or on
``/v1/messages`` the Anthropic shape vLLM's handler answers with (`tests.support.answers`); the process stays
healthy throughout. Examples are derandomized, so CI runs the same ones every time; the pinned
``@example`` bodies are a stream (always run) and bodies that were each answered with a 500 once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.support.answers import PATHS, check_answer
from tests.support.openai_bodies import CONTENT_TYPES, Kind, request_bytes
from tests.support.procs import Proc, Procs

MODEL = "qwen"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    # One process and one client session serve every example of a test, on purpose.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _sim(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[Proc]:
    procs = Procs(tmp_path_factory.mktemp("sim"))
    try:
        argv = ["sim", "serve", "Qwen/Qwen2.5-7B-Instruct", "--host", "127.0.0.1", "--port", "0"]
        argv += ["--served-model-name", MODEL, "--max-model-len", "4096", "--startup-seconds", "0"]
        proc = procs.start([*argv, "--time-scale", "1000", *extra], name="sim")
        proc.wait_url("API server")
        yield proc
    finally:
        procs.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One simulator process for the module, with a fast model clock: a request without max_tokens may decode
    the whole context."""
    yield from _sim(tmp_path_factory)


@pytest.fixture(scope="module")
def pooling_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One pooling simulator (``--runner pooling``) for the module's embeddings."""
    yield from _sim(tmp_path_factory, "--runner", "pooling")


@pytest.fixture
async def target(sim: Proc) -> AsyncIterator[tuple[Proc, aiohttp.ClientSession]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield sim, session


@pytest.fixture
async def pooling_target(pooling_sim: Proc) -> AsyncIterator[tuple[Proc, aiohttp.ClientSession]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield pooling_sim, session


async def _fuzz(target: tuple[Proc, aiohttp.ClientSession], kind: Kind, raw: bytes, content_type: str) -> None:
    sim, session = target
    headers = {"Content-Type": content_type}
    async with session.post(sim.url + PATHS[kind], data=raw, headers=headers) as resp:
        answer = (resp.status, resp.headers.get("Content-Type", ""), await resp.read())
    try:
        check_answer(kind, *answer, code_is_status=True)
    except AssertionError as exc:
        raise AssertionError(f"request body {raw[:300]!r} ({content_type}): {exc}") from None
    async with session.get(sim.url + "/health") as health:
        assert health.status == 200


JSON = "application/json"
DEEP = b"[" * 1500 + b"]" * 1500  # past the JSON parser's recursion limit


@FUZZ
@given(raw=request_bytes("chat", MODEL), content_type=CONTENT_TYPES)
@example(raw=b'{"model":"qwen","messages":[{"role":"user","content":"hi"}],"stream":true}', content_type=JSON)
@example(raw=b'{"model":"qwen","messages":' + DEEP + b"}", content_type=JSON)
@example(raw=b'{"model":"qwen","messages":[{"role":"user","content":"\\ud800"}]}', content_type=JSON)
@example(raw=b'{"model":"qwen","messages":[{"role":"\\udfff","content":"hi"}]}', content_type=JSON)
@example(raw=b'{"model":"qwen","messages":[{"role":"user","content":"hi"}]}', content_type=JSON + "; charset=nope")
async def test_generated_chat_bodies_are_answered_or_refused_with_a_4xx(
    target: Any, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "chat", raw, content_type)


@FUZZ
@given(raw=request_bytes("completion", MODEL), content_type=CONTENT_TYPES)
@example(raw=b'{"model":"qwen","prompt":"hi","stream":true}', content_type=JSON)
@example(raw=b'{"model":"qwen","prompt":' + DEEP + b"}", content_type=JSON)
@example(raw=b'{"model":"qwen","prompt":["a\\ud800"]}', content_type=JSON)
async def test_generated_completion_bodies_are_answered_or_refused_with_a_4xx(
    target: Any, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "completion", raw, content_type)


@FUZZ
@given(raw=request_bytes("embedding", MODEL), content_type=CONTENT_TYPES)
@example(raw=b'{"model":"qwen","input":["a","b"],"encoding_format":"base64"}', content_type=JSON)
@example(raw=b'{"model":"qwen","input":' + DEEP + b"}", content_type=JSON)
@example(raw=b'{"model":"qwen","input":"a\\ud800"}', content_type=JSON)
async def test_generated_embedding_bodies_at_a_pooling_server_are_answered_or_refused_with_a_4xx(
    pooling_target: Any, raw: bytes, content_type: str
) -> None:
    await _fuzz(pooling_target, "embedding", raw, content_type)


@FUZZ
@given(raw=request_bytes("response", MODEL), content_type=CONTENT_TYPES)
@example(raw=b'{"model":"qwen","input":"hi","stream":true,"max_output_tokens":3}', content_type=JSON)
@example(raw=b'{"model":"qwen","input":' + DEEP + b"}", content_type=JSON)
async def test_generated_responses_bodies_are_answered_or_refused_with_a_4xx(
    target: tuple[Proc, aiohttp.ClientSession], raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "response", raw, content_type)


@FUZZ
@given(raw=request_bytes("message", MODEL), content_type=CONTENT_TYPES)
@example(
    raw=b'{"model":"qwen","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}', content_type=JSON
)
@example(raw=b'{"model":"qwen","max_tokens":3,"messages":' + DEEP + b"}", content_type=JSON)
async def test_generated_messages_bodies_are_answered_or_refused_with_a_4xx(
    target: tuple[Proc, aiohttp.ClientSession], raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "message", raw, content_type)


@FUZZ
@given(raw=request_bytes("count", MODEL), content_type=CONTENT_TYPES)
async def test_generated_token_count_bodies_are_answered_or_refused_with_a_4xx(
    target: tuple[Proc, aiohttp.ClientSession], raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "count", raw, content_type)
