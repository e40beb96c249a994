"""Hostile input: a client's ids cannot share a slot, errors name no internal address, bad headers are 4xx."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 120}
GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
MAX_CONCURRENCY = 2


async def _statuses(url: str, ids: list[str]) -> list[int]:
    """Send one long request per id, all at once; their statuses."""

    async def one(session: aiohttp.ClientSession, rid: str) -> int:
        headers = {**GOLD, "x-request-id": rid}
        async with session.post(url + "/v1/chat/completions", data=json.dumps(CHAT), headers=headers) as resp:
            await resp.read()
            return resp.status

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, rid) for rid in ids)))


def _routable(gateway: Gateway) -> bool:
    return gateway.endpoints.routable("qwen-7b") >= 1


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_requests_sharing_one_request_id_are_limited_like_distinct_ones(
    sims: SimFactory, backend: str, request: pytest.FixtureRequest
) -> None:
    # Decoding 120 tokens at time scale 1 keeps the first requests open while the rest arrive.
    (sim,) = sims([], time_scale=1.0)
    overrides: dict[str, Any] = {"tenants.0.maxConcurrency": MAX_CONCURRENCY}
    if backend == "redis":
        overrides |= {"gateway.quotaBackend": "redis", "gateway.redisUrl": request.getfixturevalue("redis_url")}
    settings: GatewaySettings = settings_for([sim.url], **overrides)
    results: dict[str, list[int]] = {}
    for case, ids in {"distinct": [f"req-{i}" for i in range(8)], "shared": ["req-same"] * 8}.items():
        async with serve(settings) as (url, gateway):
            await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
            results[case] = sorted(await _statuses(url, ids))
    assert results["shared"] == results["distinct"] == [200] * MAX_CONCURRENCY + [429] * (8 - MAX_CONCURRENCY)


async def test_no_response_names_an_internal_address(sims: SimFactory) -> None:
    (sim,) = sims([])
    address = sim.url.split("://", 1)[1]
    async with serve(settings_for([sim.url])) as (url, gateway), aiohttp.ClientSession() as session:
        await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        async with session.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=GOLD) as ok:
            answered = (ok.status, dict(ok.headers), await ok.text())
        sim.kill()  # the gateway still believes it ready: the next request fails to connect to it
        async with session.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=GOLD) as bad:
            failed = (bad.status, dict(bad.headers), await bad.text())
    assert answered[0] == 200 and failed[0] == 503, failed
    for status, headers, body in (answered, failed):
        assert address not in body and "127.0.0.1" not in body, (status, body)
        assert not any(address in value or "127.0.0.1" in value for value in headers.values()), (status, headers)


async def test_two_authorization_headers_are_a_400(shared_sim: Any) -> None:
    headers = CIMultiDict(
        [("Authorization", f"Bearer {KEYS['gold']}"), ("Authorization", "Bearer sk-other"), ("x-request-id", "r1")]
    )
    async with serve(settings_for([shared_sim.url])) as (url, _), aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as resp:
            status, body = resp.status, await resp.json()
    assert status == 400 and body["error"]["param"] == "Authorization"


@pytest.mark.parametrize("route", [b"POST /v1/chat/completions", b"POST /v1/completions", b"GET /v1/models"])
async def test_a_non_ascii_authorization_header_is_a_400_not_a_500(shared_sim: Any, route: bytes) -> None:
    payload = json.dumps(CHAT).encode() if route.startswith(b"POST") else b""
    head = (
        route + b" HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer sk-\xff\xfe\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: " + str(len(payload)).encode()
    )
    async with serve(settings_for([shared_sim.url])) as (url, _):
        host, port = url.split("://", 1)[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + b"\r\n\r\n" + payload)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"400", answer
    assert b'"type":"invalid_request_error"' in rest.replace(b" ", b"")


async def test_a_wrong_method_is_a_405_that_says_what_is_allowed(shared_sim: Any) -> None:
    async with serve(settings_for([shared_sim.url])) as (url, _), aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/chat/completions", headers=GOLD) as resp:
            status, allow, body = resp.status, resp.headers.get("Allow", ""), await resp.json()
    assert status == 405 and "POST" in allow
    assert body["error"]["type"] == "invalid_request_error"


async def test_the_gateway_holds_the_engines_key_and_clients_never_need_it(sims: SimFactory) -> None:
    (engine,) = sims(["--api-key", "engine-key-1"])
    with_key = dataclasses.replace(settings_for([engine.url]), engine_api_key="engine-key-1")
    results = []
    for settings in (with_key, settings_for([engine.url])):
        async with serve(settings) as (url, gateway), aiohttp.ClientSession() as session:
            await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
            async with session.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=GOLD) as r:
                results.append(r.status)
    assert results == [200, 401]  # without the key the engine refuses even an authenticated tenant


async def _post_raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def test_malformed_bodies_are_400_with_openai_errors_and_never_reach_or_eject_an_engine(
    sims: SimFactory,
) -> None:
    (engine,) = sims([])
    bodies = {
        "deep": b"[" * 1500 + b"]" * 1500,  # past the parser's recursion limit, under maxBodyBytes
        "surrogate": b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "not-utf8": b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "\xff"}]}',
    }
    async with serve(settings_for([engine.url])) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        for _ in range(8):  # as many as it once took to eject a replica
            for name, body in bodies.items():
                status, _, payload = await _post_raw(url, body, GOLD)
                assert status == 400 and payload["error"]["type"] == "invalid_request_error", (name, payload)
        (endpoint,) = gateway.endpoints.members("qwen-7b")
        assert endpoint.failures == 0 and endpoint.served == 0
        status, _, _ = await _post_raw(url, json.dumps({**CHAT, "max_tokens": 4}).encode(), GOLD)
    assert status == 200


async def test_a_corrupt_gzip_body_is_a_400(shared_sim: Any) -> None:
    async with serve(settings_for([shared_sim.url])) as (url, _):
        status, _, payload = await _post_raw(url, b"\x1f\x8bnot gzip at all", {**GOLD, "Content-Encoding": "gzip"})
    assert status == 400 and payload["error"]["type"] == "invalid_request_error"


async def test_the_models_repository_id_reaches_the_engine_as_its_served_name(shared_sim: Any) -> None:
    body = {**CHAT, "model": "Qwen/Qwen2.5-7B-Instruct", "max_tokens": 4}  # the engine serves only MODEL
    async with serve(settings_for([shared_sim.url])) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        status, _, payload = await _post_raw(url, json.dumps(body).encode(), GOLD)
    assert status == 200, payload


async def test_an_unreachable_quota_store_failing_closed_is_a_503_with_retry_after_not_a_500(shared_sim: Any) -> None:
    from fleet.protocol.ports import free_port

    redis = {"gateway.redisUrl": f"redis://127.0.0.1:{free_port()}/0", "gateway.quotaStoreDown": "fail-closed"}
    settings = settings_for([shared_sim.url], **{"gateway.quotaBackend": "redis", **redis})
    async with serve(settings) as (url, _):
        status, headers, payload = await _post_raw(url, json.dumps(CHAT).encode(), GOLD)
    assert status == 503 and int(headers["Retry-After"]) >= 1
    assert payload["error"]["type"] and "quota store" in payload["error"]["message"]
