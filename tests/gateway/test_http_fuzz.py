"""Malformed input over HTTP: generated OpenAI and Anthropic bodies through the gateway are answered, never with a
5xx.

A gateway in this process in front of one simulator process; each example is one request with a valid tenant
key. Every answer is a 200 (a JSON answer, or an SSE stream that ends as its API ends one, ``data: [DONE]``, a
Responses stream's last event, Anthropic's ``message_stop``, and carries no error event) or a 4xx in OpenAI's error
shape (Anthropic's too on ``/v1/messages``), whether the gateway refused the body or relayed the engine's refusal;
and the client's input never counts against the replica (no failure, no ejection). Examples are derandomized, so
CI runs the same ones every time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings

from gateway.service import Gateway
from tests.gateway.conftest import serve, settings_for, sim_args
from tests.support.answers import PATHS, check_answer
from tests.support.openai_bodies import CONTENT_TYPES, Kind, request_bytes
from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

POOL = "qwen-7b"
KEY = f"Bearer {KEYS['gold']}"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    # One gateway, simulator and client session serve every example of a test, on purpose.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Target:
    url: str
    gateway: Gateway
    session: aiohttp.ClientSession


def _sim(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[Proc]:
    procs = Procs(tmp_path_factory.mktemp("sim"))
    try:
        proc = procs.start(sim_args("--max-model-len", "4096", *extra, time_scale=1000.0), name="sim")
        proc.wait_url("API server")
        yield proc
    finally:
        procs.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One simulator process for the module: a fast model clock and a short context, as a request without
    max_tokens may decode all of it."""
    yield from _sim(tmp_path_factory)


@pytest.fixture(scope="module")
def pooling_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A pooling simulator (``--runner pooling``) for the module's embeddings."""
    yield from _sim(tmp_path_factory, "--runner", "pooling")


@contextlib.asynccontextmanager
async def _target(sim: Proc, **overrides: Any) -> AsyncIterator[Target]:
    async with serve(settings_for([sim.url], **overrides)) as (url, gateway):
        await async_wait_for(lambda: gateway.endpoints.routable(POOL) >= 1, timeout_s=10, what="the replica routable")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=40)) as session:
            yield Target(url, gateway, session)


@pytest.fixture
async def target(sim: Proc) -> AsyncIterator[Target]:
    async with _target(sim) as found:
        yield found


@pytest.fixture
async def pooling_target(pooling_sim: Proc) -> AsyncIterator[Target]:
    async with _target(pooling_sim, **{"pools.0.engine.runner": "pooling"}) as found:
        yield found


async def _fuzz(target: Target, kind: Kind, raw: bytes, content_type: str) -> None:
    headers = {"Authorization": KEY, "Content-Type": content_type}
    async with target.session.post(target.url + PATHS[kind], data=raw, headers=headers) as resp:
        answer = (resp.status, resp.headers.get("Content-Type", ""), await resp.read())
    try:
        check_answer(kind, *answer)
    except AssertionError as exc:
        raise AssertionError(f"request body {raw[:300]!r} ({content_type}): {exc}") from None
    (endpoint,) = target.gateway.endpoints.members(POOL)
    assert endpoint.failures == 0 and endpoint.ejections == 0, (raw[:300], endpoint)


JSON = "application/json"
# Pinned so that every run streams at least once, whatever the generated bodies.
CHAT_STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3}
COMPLETION_STREAM = {"model": MODEL, "prompt": "hi", "stream": True, "max_tokens": 3}


@FUZZ
@given(raw=request_bytes("chat", MODEL), content_type=CONTENT_TYPES)
@example(raw=json.dumps(CHAT_STREAM).encode(), content_type=JSON)
async def test_generated_chat_bodies_are_answered_or_refused_with_an_openai_4xx(
    target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "chat", raw, content_type)


@FUZZ
@given(raw=request_bytes("completion", MODEL), content_type=CONTENT_TYPES)
@example(raw=json.dumps(COMPLETION_STREAM).encode(), content_type=JSON)
async def test_generated_completion_bodies_are_answered_or_refused_with_an_openai_4xx(
    target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "completion", raw, content_type)


@FUZZ
@given(raw=request_bytes("embedding", MODEL), content_type=CONTENT_TYPES)
@example(raw=json.dumps({"model": MODEL, "input": ["a", "b"], "encoding_format": "base64"}).encode(), content_type=JSON)
async def test_generated_embedding_bodies_are_answered_or_refused_with_an_openai_4xx(
    pooling_target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(pooling_target, "embedding", raw, content_type)


RESPONSE_STREAM = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 3}
MESSAGE_STREAM = {"model": MODEL, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@FUZZ
@given(raw=request_bytes("response", MODEL), content_type=CONTENT_TYPES)
@example(raw=json.dumps(RESPONSE_STREAM).encode(), content_type=JSON)
async def test_generated_responses_bodies_are_answered_or_refused_with_an_openai_4xx(
    target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "response", raw, content_type)


@FUZZ
@given(raw=request_bytes("message", MODEL), content_type=CONTENT_TYPES)
@example(raw=json.dumps(MESSAGE_STREAM).encode(), content_type=JSON)
async def test_generated_messages_bodies_are_answered_or_refused_with_a_4xx(
    target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "message", raw, content_type)


@FUZZ
@given(raw=request_bytes("count", MODEL), content_type=CONTENT_TYPES)
async def test_generated_token_count_bodies_are_answered_or_refused_with_a_4xx(
    target: Target, raw: bytes, content_type: str
) -> None:
    await _fuzz(target, "count", raw, content_type)
