"""OpenAI's Responses API through the gateway: two simulator processes keeping their responses
(``VLLM_ENABLE_RESPONSES_API_STORE=1``), two gateways of one fleet, the real ``openai`` client with a tenant's key.

A response's follow-up, retrieve and cancel reach the replica that holds it, through either gateway; another
tenant, an altered id, or a replica that stopped get OpenAI's 404; the gateway counts the tokens."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from gateway.response_ids import ResponseIds
from gateway.routing.aliases import AliasTable, WeightedAlias
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from tests.gateway.builders import counted
from tests.gateway.conftest import SimFactory, serve
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, spec
from tests.support.wait import async_wait_for

STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
ENGINE_KEY = "fleet-engine-key"  # every gateway of a fleet holds it: their response ids agree


@contextlib.asynccontextmanager
async def _gateways(replicas: list[Proc], **overrides: Any) -> AsyncIterator[tuple[list[str], list[Gateway]]]:
    urls = [r.url for r in replicas]
    stack = spec("gateway", **overrides)
    settings = GatewaySettings(
        spec=stack, static_replicas={"qwen-7b": urls}, access_log=False, engine_api_key=ENGINE_KEY
    )
    async with serve(settings) as (first, a), serve(settings) as (second, b):
        for gateway in (a, b):
            await async_wait_for(lambda g=gateway: g.endpoints.routable("qwen-7b") == 2, timeout_s=10, what="ready")
        yield [first, second], [a, b]


def _client(url: str, tenant: str = "gold") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[tenant], max_retries=0)


def _tokens(gateway: Gateway, direction: str) -> float:
    return counted(gateway, "llmfleet_gateway_tokens", {"tenant": "gold", "model": MODEL, "direction": direction})


async def test_a_follow_up_and_a_retrieve_through_another_gateway_reach_the_replica_holding_it(
    sims: SimFactory,
) -> None:
    replicas = sims([], [], env=STORE)
    async with _gateways(replicas) as ([first, second], [a, b]):
        one, other = _client(first), _client(second)
        try:
            made = await one.responses.create(model=MODEL, input="name a tide", max_output_tokens=6)
            follow = await other.responses.create(
                model=MODEL, input="and the next?", previous_response_id=made.id, max_output_tokens=6
            )
            again = await other.responses.retrieve(made.id)
            async with one.responses.stream(
                model=MODEL, input="a third", previous_response_id=follow.id, max_output_tokens=4
            ) as stream:
                kinds = [event.type async for event in stream]
                streamed = await stream.get_final_response()
            last = await other.responses.retrieve(streamed.id)
        finally:
            await one.close()
            await other.close()
    holder = ResponseIds.from_engine_key(ENGINE_KEY).open(made.id, "gold")
    assert holder is not None and holder.engine_id.startswith("resp_")
    assert holder.engine_id not in made.id  # the client never sees the engine's id
    ids = ResponseIds.from_engine_key(ENGINE_KEY)
    replicas_of = {ids.open(r.id, "gold").replica for r in (made, follow, streamed)}  # type: ignore[union-attr]
    assert replicas_of == {holder.replica}  # each follow-up went where its conversation lives
    assert follow.previous_response_id == made.id and streamed.previous_response_id == follow.id
    assert again.id == made.id and again.output_text == made.output_text
    assert last.id == streamed.id and last.output_text == streamed.output_text
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert follow.usage is not None and made.usage is not None and follow.usage.input_tokens > made.usage.input_tokens
    assert _tokens(a, "out") + _tokens(b, "out") == 6 + 6 + 4


async def test_another_tenant_an_altered_id_and_a_stopped_replica_get_openais_404(sims: SimFactory) -> None:
    replicas = sims([], [], env=STORE)
    async with _gateways(replicas) as ([url, _], [gateway, _]):
        gold, bronze = _client(url), _client(url, "bronze")
        try:
            made = await gold.responses.create(model=MODEL, input="name a tide", max_output_tokens=4)
            with pytest.raises(openai.NotFoundError) as theirs:
                await bronze.responses.retrieve(made.id)
            with pytest.raises(openai.NotFoundError):
                await bronze.responses.create(model=MODEL, input="hi", previous_response_id=made.id)
            with pytest.raises(openai.NotFoundError):
                await gold.responses.retrieve(made.id[:-2] + ("AA" if not made.id.endswith("AA") else "BB"))
            held = ResponseIds.from_engine_key(ENGINE_KEY).open(made.id, "gold")
            assert held is not None
            next(r for r in replicas if r.url == gateway.endpoints.get("qwen-7b", held.replica).url).stop()  # type: ignore[union-attr]
            await async_wait_for(lambda: gateway.endpoints.routable("qwen-7b") == 1, timeout_s=10, what="probe")
            with pytest.raises(openai.NotFoundError) as gone:
                await gold.responses.create(model=MODEL, input="hi", previous_response_id=made.id)
            with pytest.raises(openai.NotFoundError):
                await gold.responses.retrieve(made.id)
            still = await gold.responses.create(model=MODEL, input="a new one", max_output_tokens=2)
        finally:
            await gold.close()
            await bronze.close()
    assert theirs.value.body == {
        "message": f"Response with id '{made.id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    assert isinstance(gone.value.body, dict) and gone.value.body["param"] == "previous_response_id"
    assert still.status == "incomplete"  # new conversations go on on the replica left


async def test_cancel_reaches_the_holder_and_the_engines_own_refusal_comes_back_with_the_gateways_id(
    sims: SimFactory,
) -> None:
    replicas = sims([], [], env=STORE, time_scale=1.0)
    async with _gateways(replicas) as ([first, second], _):
        one, other = _client(first), _client(second)
        try:
            running = await one.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=4000)
            cancelled = await other.responses.cancel(running.id)
            done = await one.responses.create(model=MODEL, input="hi", max_output_tokens=2)
            with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
                await other.responses.cancel(done.id)
        finally:
            await one.close()
            await other.close()
        async with httpx.AsyncClient(base_url=first) as raw:
            bad = await raw.post("/v1/responses", json={"model": MODEL, "input": 3}, headers=_bearer())
    assert running.status == "queued" and cancelled.id == running.id and cancelled.status == "cancelled"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS['gold']}"}


async def test_without_the_engines_store_a_follow_up_gets_the_engines_404_naming_the_clients_id(
    sims: SimFactory,
) -> None:
    replicas = sims([], [])  # vLLM's default: store=true is dropped
    async with _gateways(replicas) as ([url, _], _):
        client = _client(url)
        try:
            made = await client.responses.create(model=MODEL, input="name a tide", max_output_tokens=2)
            with pytest.raises(openai.NotFoundError) as forgotten:
                await client.responses.create(model=MODEL, input="and?", previous_response_id=made.id)
            with pytest.raises(openai.NotFoundError) as retrieved:
                await client.responses.retrieve(made.id)
        finally:
            await client.close()
    for refused in (forgotten.value, retrieved.value):
        assert isinstance(refused.body, dict) and refused.body["message"] == f"Response with id '{made.id}' not found."


async def test_a_background_response_is_charged_its_whole_reservation(sims: SimFactory) -> None:
    replicas = sims([], [], env=STORE, time_scale=1.0)
    async with _gateways(replicas, **{"tenants.0.tokensPerMinute": 5000}) as ([url, _], _):
        client = _client(url)
        try:
            running = await client.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=4000)
            # Its answer came at once with no usage; the 4,000 tokens it may still generate are spent already.
            with pytest.raises(openai.RateLimitError):
                await client.responses.create(model=MODEL, input="hi", max_output_tokens=1500)
            await client.responses.cancel(running.id)
        finally:
            await client.close()


async def test_a_streamed_background_response_replays_through_another_gateway_with_the_clients_ids(
    sims: SimFactory,
) -> None:
    replicas = sims([], [], env=STORE)
    async with _gateways(replicas) as ([first, second], _):
        one, other = _client(first), _client(second)
        try:
            live = await one.responses.create(
                model=MODEL, input="name a tide", background=True, stream=True, max_output_tokens=5
            )
            seen = [event async for event in live]
            response_id = seen[0].response.id  # type: ignore[union-attr]
            replayed = await other.responses.retrieve(response_id, stream=True, starting_after=2)
            tail = [event async for event in replayed]
        finally:
            await one.close()
            await other.close()
    assert ResponseIds.from_engine_key(ENGINE_KEY).open(response_id, "gold") is not None  # the gateway's id
    assert [e.sequence_number for e in tail] == list(range(3, len(seen)))
    assert tail[-1].type == "response.completed" and tail[-1].response.id == response_id  # type: ignore[union-attr]


async def test_a_follow_up_stays_on_its_pool_whatever_the_aliases_weights_say(
    sims: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    names = ["qwen-v1", "qwen-v2"]
    v1, v2 = sims(*(["--served-model-name", n] for n in names), env=STORE)
    engine = {"kind": "sim", "maxNumSeqs": 8, "maxModelLen": 8192}
    pools = [{"name": n, "model": "Qwen/Qwen2.5-7B-Instruct", "servedModelName": n, "engine": engine} for n in names]
    aliases = {"chat": {"pools": {"qwen-v1": 1, "qwen-v2": 0}}}
    stack = spec("gateway", pools=pools, aliases=aliases, **{"tenants.1.allowedModels": ["chat"]})
    replicas = {"qwen-v1": [v1.url], "qwen-v2": [v2.url]}
    settings = GatewaySettings(spec=stack, static_replicas=replicas, access_log=True, engine_api_key=ENGINE_KEY)
    caplog.set_level(logging.INFO, logger="llmfleet.gateway.access")
    async with serve(settings) as (url, gateway):
        await async_wait_for(lambda: gateway.endpoints.routable("qwen-v2") == 1, timeout_s=10, what="ready")
        client = _client(url)
        try:
            made = await client.responses.create(model="chat", input="name a tide", max_output_tokens=2)
            # A rollout moves the alias to qwen-v2; the conversation begun on qwen-v1 goes on there.
            gateway.set_aliases(AliasTable({"chat": WeightedAlias("chat", {"qwen-v1": 0, "qwen-v2": 1})}))
            follow = await client.responses.create(model="chat", input="and?", previous_response_id=made.id)
            fresh = await client.responses.create(model="chat", input="a new one", max_output_tokens=2)
            with pytest.raises(openai.NotFoundError):  # another model's pool does not hold it
                await client.responses.create(model="qwen-v2", input="and?", previous_response_id=made.id)
            await client.responses.retrieve(follow.id)
        finally:
            await client.close()
        routed = {pool: counted(gateway, "llmfleet_gateway_alias_routed", {"pool": pool}) for pool in names}
    assert (made.model, follow.model, fresh.model) == ("qwen-v1", "qwen-v1", "qwen-v2")
    assert routed == {"qwen-v1": 2, "qwen-v2": 1}  # the follow-up counted where it went, not where the weights drew
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmfleet.gateway.access"]
    retrieve = [line for line in lines if line.get("route") == "GET /v1/responses/{response_id}"]
    assert len(retrieve) == 1 and retrieve[0]["status"] == 200 and retrieve[0]["replica"] == "qwen-v1-static-0"
    assert follow.id not in json.dumps(retrieve)  # no response id in the log
