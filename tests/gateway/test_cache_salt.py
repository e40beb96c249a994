"""Cache salts: one per tenant (or cache group), the same on every gateway, valid for vLLM; a client's own salt
folded in, never used alone; and on a simulated engine, a tenant's prefix cache hits for it and never for another."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import aiohttp
import pytest

from gateway.body import parse_body
from gateway.cache_salt import CacheSalts, check_client_salt
from gateway.errors import BadRequest
from gateway.service import Gateway
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

VLLM_SALT = re.compile(r"^[^@/\\\x00]{1,128}$")  # vLLM's validate_cache_salt
SALTS = CacheSalts.from_engine_key("sk-engines")


def test_every_gateway_and_restart_derives_the_same_salt_from_the_fleets_engine_key() -> None:
    again = CacheSalts.from_engine_key("sk-engines")
    assert again.for_tenant("gold") == SALTS.for_tenant("gold")
    assert CacheSalts.from_engine_key(None).for_tenant("gold") == CacheSalts.from_engine_key("").for_tenant("gold")
    assert CacheSalts.from_engine_key("sk-other-fleet").for_tenant("gold") != SALTS.for_tenant("gold")


@pytest.mark.parametrize("name", ["gold", "bronze", "a", "x" * 63, "tenant-with-dashes"])
def test_salts_are_43_base64url_characters_that_vllm_accepts(name: str) -> None:
    for salt in (SALTS.for_tenant(name), SALTS.combined(SALTS.for_tenant(name), "client/part@x")):
        assert len(salt) == 43 and re.fullmatch(r"[A-Za-z0-9_-]+", salt) and VLLM_SALT.match(salt)


def test_tenants_get_different_salts_unless_they_share_a_cache_group() -> None:
    assert SALTS.for_tenant("gold") != SALTS.for_tenant("bronze")
    assert SALTS.for_tenant("gold", "team") == SALTS.for_tenant("bronze", "team")
    assert SALTS.for_tenant("gold", "team") != SALTS.for_tenant("team")  # a group is not the tenant of that name
    assert SALTS.for_tenant("gold", "bronze") != SALTS.for_tenant("bronze")


def test_a_client_salt_partitions_within_its_tenant_and_never_reaches_another_tenants_salt() -> None:
    gold, bronze = SALTS.for_tenant("gold"), SALTS.for_tenant("bronze")
    assert SALTS.combined(gold, None) == gold
    assert SALTS.combined(gold, "a") not in (gold, bronze, SALTS.combined(gold, "b"), SALTS.combined(bronze, "a"))
    assert SALTS.combined(gold, bronze) != bronze  # naming another tenant's salt gets a salt of one's own
    assert SALTS.combined(gold, "a") == SALTS.combined(gold, "a")


@pytest.mark.parametrize("salt", ["a/b", "x@y", "back\\slash", "nul\x00", "a" * 129, "", 7, ["a"]])
def test_a_client_salt_vllm_would_refuse_is_a_400_naming_cache_salt(salt: object) -> None:
    with pytest.raises(BadRequest) as info:
        check_client_salt(salt)
    assert info.value.param == "cache_salt"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "cache_salt": salt}).encode()
    with pytest.raises(BadRequest) as info:
        parse_body(body, "chat")
    assert info.value.param == "cache_salt"


@pytest.mark.parametrize("kind", ["chat", "completion", "response", "message", "embedding"])
def test_the_engine_gets_the_gateways_salt_in_place_of_the_clients(kind: str) -> None:
    fields = {
        "chat": {"messages": [{"role": "user", "content": "x"}]},
        "completion": {"prompt": "x"},
        "response": {"input": "x"},
        "message": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
        "embedding": {"input": "x"},
    }[kind]
    parsed = parse_body(json.dumps({"model": "m", **fields, "cache_salt": "mine"}).encode(), kind)  # type: ignore[arg-type]
    assert parsed.client_salt == "mine"
    salt = SALTS.combined(SALTS.for_tenant("gold"), parsed.client_salt)
    assert json.loads(parsed.upstream_body("m", None, salt))["cache_salt"] == salt


def test_a_token_count_carries_no_salt_and_drops_the_clients() -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "cache_salt": "mine"}).encode()
    assert "cache_salt" not in json.loads(parse_body(raw, "count").upstream_body("m"))


# -- on a simulated engine -------------------------------------------------------------------------------------

PROMPT = "The secret system prompt of tenant gold, which nobody else should be able to time. " * 12


def _routable(gateway: Gateway) -> bool:
    return gateway.upstream.routable("qwen-7b") > 0


async def _cached(url: str, tenant: str, salt: str | None = None) -> int:
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            answer = await resp.json()
            assert resp.status == 200, answer
    cached: int = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


async def test_a_tenants_prefix_hits_for_it_and_never_for_another_tenant(sims: SimFactory) -> None:
    (engine,) = sims(["--enable-prompt-tokens-details"])
    async with serve(settings_for([engine.url])) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        assert await _cached(url, "gold") == 0
        assert await _cached(url, "bronze") == 0  # the same prompt, another tenant: a miss
        assert await _cached(url, "gold") > 0  # the same tenant again: a hit (the salt is stable)
        assert await _cached(url, "gold", "conversation-1") == 0  # a client salt partitions within the tenant
        assert await _cached(url, "gold", "conversation-1") > 0
        assert await _cached(url, "bronze", "conversation-1") == 0


async def test_tenants_of_one_cache_group_share_their_prefixes(sims: SimFactory) -> None:
    (engine,) = sims(["--enable-prompt-tokens-details"])
    grouped = {"tenants.0.cacheGroup": "team", "tenants.1.cacheGroup": "team"}
    async with serve(settings_for([engine.url], **grouped)) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        assert await _cached(url, "gold") == 0
        assert await _cached(url, "bronze") > 0


async def test_two_gateways_of_one_fleet_give_a_tenant_the_same_salt_and_two_tenants_different_ones(
    sims: SimFactory,
) -> None:
    (engine,) = sims(["--enable-prompt-tokens-details"])
    settings = dataclasses.replace(settings_for([engine.url]), engine_api_key="sk-fleet-engines")
    async with serve(settings) as (first, one), serve(settings) as (second, two):
        for gateway in (one, two):
            await async_wait_for(functools.partial(_routable, gateway), timeout_s=10, what="the replica routable")
        assert await _cached(first, "gold") == 0
        assert await _cached(second, "gold") > 0  # another gateway, the same tenant: the same salt, a hit
        assert await _cached(second, "bronze") == 0
